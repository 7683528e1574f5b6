"""The harmony frames grammar's shape and its refusals (the served behaviour is in test_families)."""

from __future__ import annotations

import re

import pytest

from helios.frontend.structured.grammar import GrammarError
from helios.frontend.structured.grammar_channels import channels_lark
from helios.frontend.structured.grammar_lark import Speller
from helios.frontend.structured.grammar_tools import AnswerKind, CallPolicy, ToolSchema
from helios.frontend.parsers import FramePosition, FrameStart, TokenDelimiters
from helios.frontend.decoding.syntax import example_harmony

CHANNELS = example_harmony()
IDS = {control: 500 + i for i, control in enumerate(CHANNELS.controls)}
SPELLER = Speller(lambda text: ([1] * len(text), [(i, i + 1) for i in range(len(text))]), lambda _: True,
                  TokenDelimiters(IDS))
TOOL = ToolSchema.from_openai([{"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {}}}}])
HEADER = FrameStart(FramePosition.HEADER, header_text="assistant")


def test_a_forced_call_is_one_frame_to_the_function_after_a_bounded_reasoning_frame():
    lark = channels_lark(CHANNELS, SPELLER, HEADER, CallPolicy(TOOL, AnswerKind.NONE, True), AnswerKind.NONE, {}, 64)
    assert f'<[{IDS["<|channel|>"]}]> "commentary to=functions.get_time " <[{IDS["<|constrain|>"]}]> "json"' in lark
    assert "max_tokens=64" in lark and "@answer" not in lark
    assert lark.splitlines()[0].startswith("start: final_")  # the prompt's header is continued


def test_a_structured_answer_is_the_final_channel():
    lark = channels_lark(CHANNELS, SPELLER, FrameStart(), None, AnswerKind.STRUCTURED, {})
    assert f'"final" <[{IDS["<|message|>"]}]> @answer' in lark
    assert lark.splitlines()[0].startswith(f"start: <[{IDS['<|start|>']}]> frames_")


@pytest.mark.parametrize("start", [
    FrameStart(FramePosition.BODY, recipient="assistant<|channel|>commentary to=functions.get_time <|constrain|>json"),
    FrameStart(FramePosition.HEADER, header_text="assistant<|channel|>final")])
def test_a_tool_body_or_a_longer_header_cannot_be_continued(start):
    with pytest.raises(GrammarError, match="cannot continue"):
        channels_lark(CHANNELS, SPELLER, start, None, AnswerKind.STRUCTURED, {})


def test_an_open_reasoning_body_continues_its_text_then_the_frames():
    start = FrameStart(FramePosition.BODY, recipient="assistant<|channel|>analysis")
    lark = channels_lark(CHANNELS, SPELLER, start, None, AnswerKind.STRUCTURED, {})
    first = lark.splitlines()[0]
    assert first.startswith("start: reasoning_text_") and f"<[{IDS['<|end|>']}]> <[{IDS['<|start|>']}]>" in first


# -- an assistant prefill (continue_final_message) under a grammar, served ------------------------------

PREFILL = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}]
REPLY = {"type": "json_schema", "json_schema": {"name": "r", "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def harmony():
    from pathlib import Path

    from frontend.parsers.conftest import HARMONY_CONTROLS, small_bpe
    from frontend.served import cached_model, harmony_frontend, served_contract
    from helios.frontend.session import FrontendModel

    tokenizer = small_bpe(["<|endoftext|>", *HARMONY_CONTROLS])
    eos = [tokenizer.token_to_id(text) for text in ("<|endoftext|>", "<|return|>", "<|call|>")]
    contract = served_contract(tokenizer.get_vocab_size(), harmony_frontend(), eos)
    source = (Path(__file__).parent.parent / "fixtures" / "templates" / "gpt_oss.jinja").read_text()
    model = cached_model("harmony-gpt-oss", tokenizer, lambda: FrontendModel.from_contract(contract, tokenizer, source))
    return model, tokenizer


def continued(harmony, text: str, **fields):
    """The output ``text`` (controls as their tokens) after a prefilled final answer under `fields`:
    each token must be allowed by the request's grammar; returns the parsed result."""
    from frontend.served import ids_of, run_output
    from helios.server.schemas import ChatCompletionRequest

    model, tokenizer = harmony
    body = {"model": model.served_id, "messages": PREFILL, "continue_final_message": True, **fields}
    prepared = model.prepare_chat(ChatCompletionRequest.model_validate(body))
    assert prepared.prompt.text.endswith("<|channel|>final<|message|>Sure: ")
    ids = ids_of(tokenizer, *(piece for piece in re.split(r"(<\|[a-z]+\|>)", text) if piece))
    matcher = prepared.grammar.fork()
    for token_id in ids:
        assert matcher.consume_token(token_id), (tokenizer.decode([token_id], skip_special_tokens=False), matcher.error)
    assert matcher.is_stopped
    return run_output(prepared, ids)[1].result


def test_a_prefilled_final_answer_continues_under_a_response_format(harmony):
    """Qwen's tag grammars continue a prefilled answer with the structured one; harmony's refused
    any open body (a 400), though the final channel's body is where the answer goes."""
    result = continued(harmony, '{"a":1}<|return|>', response_format=REPLY)
    assert (result.content, result.tool_calls, result.errors) == ('{"a":1}', (), ())


def test_a_prefilled_final_answer_is_followed_by_a_forced_call_in_its_own_frame(harmony):
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    result = continued(harmony, "<|end|><|start|>assistant<|channel|>commentary to=functions.get_time "
                                "<|constrain|>json<|message|>{}<|call|>", tools=[tool], tool_choice="required")
    assert [(call.name, call.arguments) for call in result.tool_calls] == [("get_time", "{}")]
    assert (result.content, result.errors) == ("", ())

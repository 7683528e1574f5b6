"""Usage details of one output: ``completion_tokens_details.reasoning_tokens`` (the generated tokens
between the reasoning delimiters, as vLLM counts them) and ``prompt_tokens_details.cached_tokens``
(the engine's reused prompt tokens), through a prepared request's real output path, and the finish
reason of an output a client's stop ends after tool calls."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_harmony
from helios.frontend.parsers import FramePosition, FrameStart, OutputPipeline, OutputRequest, OutputStart
from helios.frontend.responses.presentation import finish_reason
from helios.runtime.records.events import FinishReason
from helios.server.schemas import ChatCompletionRequest

from .parsers.conftest import HARMONY_CONTROLS, small_bpe
from .parsers.golden import delimiters_for, detokenize, encode
from .parsers.tools import TOOLS
from .served import ids_of, qwen_model, run_output

TOOL_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    return qwen_model(qwen_tokenizer)


def prepared_chat(model, **fields):
    body = {"model": model.served_id, "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
            **fields}
    return model.prepare_chat(ChatCompletionRequest.model_validate(body))


@pytest.mark.parametrize("reasoning", [
    "Let me look.",
    "Let me look.\n\nStep one: 東京 🧪 &amp; more\n",  # held newlines, characters split over byte tokens
    "\n",  # only the wrapping the close delimiter strips
])
def test_reasoning_tokens_are_the_tokens_before_the_close_delimiter(qwen, qwen_tokenizer, reasoning):
    """The prompt opened reasoning (Qwen-style): every token before ``</think>`` is reasoning; the
    close delimiter, the answer, the tool call and the EOS are not."""
    prepared = prepared_chat(qwen)
    thought = ids_of(qwen_tokenizer, reasoning)
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    answer = thought + ids_of(qwen_tokenizer, "</think>", "\n\nSure.\n\n", TOOL_CALL) + [eos]
    _, final = run_output(prepared, answer, reused_prompt_tokens=16)
    held = int(qwen_tokenizer.decode(thought[-1:]) == "\n")  # a lone newline before the close is its wrapping
    assert final.usage.reasoning_tokens == len(thought) - held
    assert final.usage.cached_tokens == 16
    assert final.usage.completion_tokens == len(answer)


@pytest.mark.parametrize("held", ["\n", "\n\n"])
def test_held_text_alone_cut_by_the_limit_is_reasoning_the_prompt_opened(qwen, qwen_tokenizer, held):
    """An output of newlines only (text the parser holds as the close delimiter's possible wrapping),
    cut by the limit in reasoning the prompt opened, is reasoning: it counted none."""
    thought = ids_of(qwen_tokenizer, held)
    _, final = run_output(prepared_chat(qwen), thought, FinishReason.LENGTH)
    assert final.usage.reasoning_tokens == len(thought)


def test_reasoning_cut_by_the_output_limit_counts_every_token(qwen, qwen_tokenizer):
    prepared = prepared_chat(qwen)
    thought = ids_of(qwen_tokenizer, "Thinking about 🧪 and\n")
    _, final = run_output(prepared, thought, FinishReason.LENGTH)
    assert final.result.reasoning and final.usage.reasoning_tokens == len(thought)


def test_no_reasoning_counts_nothing(qwen, qwen_tokenizer):
    prepared = prepared_chat(qwen, chat_template_kwargs={"enable_thinking": False})
    answer = ids_of(qwen_tokenizer, "Sure. 東京 🧪") + [qwen_tokenizer.token_to_id("<|im_end|>")]
    _, final = run_output(prepared, answer)
    assert final.result.content and not final.result.reasoning
    assert final.usage.reasoning_tokens == 0


def test_harmony_reasoning_tokens_are_the_analysis_bodies():
    """Harmony: the analysis channel's body tokens; headers, controls and the final answer are not."""
    harmony_tokenizer = small_bpe(["<|endoftext|>", *HARMONY_CONTROLS])
    syntax = OutputSyntax(ReasoningSyntaxKind.HARMONY_CHANNELS, ToolSyntaxKind.HARMONY_CHANNELS,
                          channels=example_harmony())
    delimiters = delimiters_for(harmony_tokenizer, syntax.delimiter_spellings())
    header = FrameStart(FramePosition.HEADER, header_text="assistant")
    pipeline = OutputPipeline.create(syntax, delimiters, OutputRequest(TOOLS, "call_", OutputStart(frame=header)))
    analysis = encode(harmony_tokenizer, ["The user says hi. Twice over."])
    ids = (encode(harmony_tokenizer, ["<|channel|>analysis<|message|>"]) + analysis
           + encode(harmony_tokenizer, ["<|end|><|start|>assistant<|channel|>final<|message|>Hello there!"]))
    for token_id, text in detokenize(harmony_tokenizer, ids):
        pipeline.feed(token_id, text)
    pipeline.finish()
    assert pipeline.result().reasoning == "The user says hi. Twice over."
    assert pipeline.num_reasoning_tokens == len(analysis)


@pytest.mark.parametrize("stop", [{"stop": ["</tool_call>"]}, {"stop_token_ids": [None]}])
def test_a_client_stop_after_a_tool_call_finishes_with_tool_calls(qwen, qwen_tokenizer, stop):
    """vLLM reads a stop that ends an output holding tool calls as ``tool_calls``; a cut keeps ``length``."""
    closer = qwen_tokenizer.token_to_id("</tool_call>")
    if "stop_token_ids" in stop:
        stop = {"stop_token_ids": [closer]}
    prepared = prepared_chat(qwen, chat_template_kwargs={"enable_thinking": False}, **stop)
    answer = ids_of(qwen_tokenizer, TOOL_CALL, "\nmore text")
    _, final = run_output(prepared, answer, FinishReason.LENGTH)  # the engine's end after the stop
    assert final.reason is FinishReason.STOP and [c.name for c in final.result.tool_calls] == ["get_weather"]
    assert finish_reason(final) == "tool_calls"
    _, final = run_output(prepared_chat(qwen, chat_template_kwargs={"enable_thinking": False}), answer,
                          FinishReason.LENGTH)  # no stop: the output limit cut it after the call
    assert final.result.tool_calls and finish_reason(final) == "length"

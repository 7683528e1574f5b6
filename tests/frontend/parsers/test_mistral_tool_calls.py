"""Mistral-family tool calls: ids a Mistral template renders back, the newer `[TOOL_CALLS]NAME[ARGS]{...}`
spelling, and `"arguments": null` in JSON calls.

- Ids: a client sends a response's calls back as history. Mistral's templates render only ids of nine
  alphanumerics ("Tool call IDs should be alphanumeric strings with length 9!"), so a core whose
  contract declares `tool_call_id_len` gives calls such ids (random, distinct); a core without the field
  keeps `call_<request id>_<index>`.
- `[TOOL_CALLS]NAME[ARGS]{...}`, one opener per call: the `mistral-args` family's contract data,
  mapped by the runtime's contract reader, parses it (the JSON-array syntax made every such call
  MALFORMED_CALL).
- `"arguments": null` is no arguments, as an absent key is (it made the block content).
"""

from __future__ import annotations

import json
import re

import pytest
from google.protobuf.json_format import MessageToDict

from helios.contract import serving_pb2 as spb
from helios.errors import RequestError
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.decoding.syntax import JsonCallSyntax, OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters
from helios.frontend.parsers.calls import CallIds
from helios.frontend.session import FrontendModel
from helios.frontend.structured.contract_syntax import output_syntax
from helios.ignition.frontend.families import BY_NAME
from helios.ignition.frontend.render import ProbeTemplate
from helios.server.schemas import ChatCompletionRequest
from support.family_checkpoints import MISTRAL_ARGS_TEMPLATE, MISTRAL_TOKENS, TEMPLATES

from ..served import ids_of, run_output, served_contract
from .conftest import small_bpe
from .golden import Call, Expect, check_golden, delimiters_for, detokenize, encode
from .tools import OPENAI_TOOLS, TOOLS

NINE_ALPHANUMERICS = re.compile(r"[A-Za-z0-9]{9}")
UNOPENED = ReasoningState.UNOPENED
PARIS = Call("get_weather", {"city": "Paris"})
HERMES = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.JSON_CALLS,
                      tools=JsonCallSyntax("<tool_call>", "</tool_call>", name_key="name", arguments_key="arguments"))
MISTRAL = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.JSON_CALLS,
                       tools=JsonCallSyntax("[TOOL_CALLS]", name_key="name", arguments_key="arguments"))



@pytest.fixture(scope="module")
def mistral_tokenizer():
    """Mistral's special tokens ([TOOL_CALLS], [ARGS], ...) on a small byte-level BPE."""
    return small_bpe([*MISTRAL_TOKENS, "[ARGS]"])


def check(tokenizer, syntax: OutputSyntax, segments: list[str], expect: Expect, seed: str) -> None:
    delimiters = delimiters_for(tokenizer, syntax.delimiter_spellings())
    stream = detokenize(tokenizer, encode(tokenizer, segments))
    make = lambda: OutputPipeline.create(syntax, delimiters, OutputRequest(TOOLS, "call_", OutputStart(UNOPENED)))
    check_golden(make, stream, delimiters, expect, seed=seed)


# -- "arguments": null ---------------------------------------------------------------------------------
@pytest.mark.parametrize("syntax, text", [
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": null}\n</tool_call>'),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": null}, {"name": "get_weather", '
              '"arguments": {"city": "Paris"}}]'),
], ids=["hermes", "mistral"])
def test_null_arguments_are_no_arguments(mistral_tokenizer, syntax, text):
    expected = (Call("get_time", {}),) if syntax is HERMES else (Call("get_time", {}), PARIS)
    check(mistral_tokenizer, syntax, [text], Expect("", "", expected), seed=text)


# -- [TOOL_CALLS]NAME[ARGS]{...} -----------------------------------------------------------------------
def args_syntax() -> OutputSyntax:
    """The `mistral-args` family's contract data as the runtime maps it."""
    frontend = spb.FrontendContract(tool_parser=BY_NAME["mistral-args"].tool_parser,
                                    reasoning_parser=spb.REASONING_PARSER_NONE)
    frontend.tool_syntax.CopyFrom(BY_NAME["mistral-args"].tool_syntax)
    return output_syntax(frontend)


ARGS_CASES = {
    "one_call": (['[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'], Expect("", "", (PARIS,))),
    "parallel_calls": (['[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'],
                       Expect("", "", (PARIS, Call("get_time", {})))),
    "answer_then_call": (['Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'],
                         Expect("", "Let me check.", (PARIS,))),
    "repeated_opener": (['[TOOL_CALLS][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}\n[TOOL_CALLS]get_time[ARGS]{}'],
                        Expect("", "", (PARIS, Call("get_time", {})))),
    "plain_answer": (["It is [sunny] today."], Expect("", "It is [sunny] today.")),
    "cut_arguments": (['[TOOL_CALLS]get_weather[ARGS]{"city": "Pa'],
                      Expect("", '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', (), (K.MALFORMED_CALL,))),
}


@pytest.mark.parametrize("name", sorted(ARGS_CASES))
def test_args_calls_parse(mistral_tokenizer, name):
    segments, expect = ARGS_CASES[name]
    check(mistral_tokenizer, args_syntax(), segments, expect, seed=name)


def test_args_template_calls_parse_back(mistral_tokenizer):
    """What the newer template renders for an assistant turn with two calls is read back as those calls."""
    calls = [("get_weather", {"city": "Zürich", "tags": ["a", "[ARGS]"], "options": {"x": None}}), ("get_time", {})]
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"abcdefgh{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)]}
    template = ProbeTemplate(MISTRAL_ARGS_TEMPLATE, {"bos_token": "<s>", "eos_token": "</s>"})
    rendered = template.render([{"role": "user", "content": "q"}, message])
    output = rendered.partition("[/INST]")[2].removesuffix("</s>")
    check(mistral_tokenizer, args_syntax(), [output], Expect("", "", tuple(Call(*c) for c in calls)), seed="render")


# -- call ids ------------------------------------------------------------------------------------------
def test_random_call_ids_are_nine_distinct_alphanumerics():
    ids = CallIds("call_r_", 9)
    allocated = [ids.allocate() for _ in range(200)]
    assert [index for index, _ in allocated] == list(range(200))
    assert all(NINE_ALPHANUMERICS.fullmatch(call_id) for _, call_id in allocated)
    assert len({call_id for _, call_id in allocated}) == 200
    assert [CallIds("call_r_").allocate() for _ in range(2)] == [(0, "call_r_0"), (0, "call_r_0")]


def test_a_pipeline_gives_calls_the_requested_id_length():
    request = OutputRequest(TOOLS, "call_r_", OutputStart(UNOPENED), call_id_len=9)
    pipeline = OutputPipeline.create(MISTRAL, TokenDelimiters(), request)
    pipeline.feed(1, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]')
    pipeline.finish()
    call_ids = [call.call_id for call in pipeline.result().tool_calls]
    assert len(call_ids) == 2 and len(set(call_ids)) == 2
    assert all(NINE_ALPHANUMERICS.fullmatch(call_id) for call_id in call_ids)


def mistral_model(tokenizer, tool_call_id_len: int) -> FrontendModel:
    """A FrontendModel of the Mistral v0.3 template with the frontend prepare derives for it."""
    family = BY_NAME["mistral"]
    frontend = {
        "tool_parser": spb.ToolParser.Name(family.tool_parser), "reasoning_parser": "REASONING_PARSER_NONE",
        "tool_syntax": MessageToDict(family.tool_syntax, preserving_proto_field_name=True),
        "assistant_boundary": {"message_start": "", "message_end": "</s>", "assistant_header": "[/INST]"},
    }
    if tool_call_id_len:
        frontend["tool_call_id_len"] = tool_call_id_len
    tokens = [{"name": name, "text": text, "token_id": tokenizer.token_to_id(text)}
              for name, text in (("bos_token", "<s>"), ("eos_token", "</s>"))]
    contract = served_contract(tokenizer.get_vocab_size(), frontend, [tokenizer.token_to_id("</s>")], tokens)
    return FrontendModel.from_contract(contract, tokenizer, (TEMPLATES / "mistral_v0_3.jinja").read_text())


def call_then_history(model: FrontendModel, tokenizer) -> dict:
    """A turn whose output is a call, and the next turn's body replaying that response as history."""
    first = [{"role": "user", "content": "Weather in Paris?"}]
    body = {"model": model.served_id, "messages": first, "tools": OPENAI_TOOLS}
    prepared = model.prepare_chat(ChatCompletionRequest.model_validate(body), request_id="request1")
    output = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    _, final = run_output(prepared, ids_of(tokenizer, output))
    message = prepared.response_body(final)["choices"][0]["message"]
    (call,) = message["tool_calls"]
    result = {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"sky": "clear"})}
    return {**body, "messages": [*first, message, result]}


@pytest.mark.parametrize("choice", [0, 1])
def test_a_core_declaring_nine_character_ids_takes_its_calls_back_as_history(mistral_tokenizer, choice):
    model = mistral_model(mistral_tokenizer, 9)
    body = call_then_history(model, mistral_tokenizer)
    call_id = body["messages"][1]["tool_calls"][0]["id"]
    assert NINE_ALPHANUMERICS.fullmatch(call_id), call_id
    prepared = model.prepare_chat(ChatCompletionRequest.model_validate(body), request_id="r2")
    if choice:  # another choice (n > 1) of the same body draws ids the same way
        prepared = model.prepare_choice(prepared, "r2-1")
    assert prepared.output.request.call_id_len == 9
    assert mistral_tokenizer.decode(list(prepared.prompt_token_ids), skip_special_tokens=False).count(call_id) == 2


def test_a_core_without_the_field_keeps_request_ids(mistral_tokenizer):
    """Old cores serve as before: ids `call_<request id>_<index>` (which this template refuses back)."""
    model = mistral_model(mistral_tokenizer, 0)
    body = call_then_history(model, mistral_tokenizer)
    assert body["messages"][1]["tool_calls"][0]["id"] == "call_request1_0"
    with pytest.raises(RequestError, match="length 9"):
        model.prepare_chat(ChatCompletionRequest.model_validate(body), request_id="r2")

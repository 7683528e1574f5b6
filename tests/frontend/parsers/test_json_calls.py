"""Golden tests: JSON tool calls (Hermes, Mistral, Llama 3.x, DeepSeek V3 and V3.1 spellings) on real
tokenizers, fed one token at a time, all at once and in random chunks."""

from __future__ import annotations

import pytest

from helios.errors import ContractError
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import AnswerMode, OutputPipeline, OutputRequest, OutputStart, ReasoningState
from helios.frontend.decoding.syntax import (
    JsonCallSyntax,
    OutputSyntax,
    ReasoningSyntaxKind,
    ToolSyntaxKind,
    example_deepseek_v3,
    example_hermes,
    example_think_tags,
)

from .golden import Call, Expect, check_golden, delimiters_for, detokenize, encode
from .tools import TOOLS

HERMES = OutputSyntax(ReasoningSyntaxKind.THINK_TAGS, ToolSyntaxKind.JSON_CALLS, think=example_think_tags(),
                      tools=example_hermes())
MISTRAL = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.JSON_CALLS,
                       tools=JsonCallSyntax("[TOOL_CALLS]", name_key="name", arguments_key="arguments"))
LLAMA = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.JSON_CALLS,
                     tools=JsonCallSyntax(name_key="name", arguments_key="parameters"))
DEEPSEEK = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.JSON_CALLS, tools=example_deepseek_v3())
DEEPSEEK_31 = OutputSyntax(ReasoningSyntaxKind.THINK_TAGS, ToolSyntaxKind.JSON_CALLS,
                           think=example_think_tags(), tools=JsonCallSyntax(
                               "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", invoke_open="<｜tool▁call▁begin｜>",
                               name_end="<｜tool▁sep｜>", invoke_close="<｜tool▁call▁end｜>"))
PARIS = Call("get_weather", {"city": "Paris"})
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
DS_CALL = ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
           "<｜tool▁call▁end｜>")
UNOPENED, OPEN = ReasoningState.UNOPENED, ReasoningState.OPEN

CASES = {
    "hermes_reasoning_answer_call": (
        HERMES, UNOPENED, ["<think>\nLook it up.\n</think>\n\nSure.\n" + HERMES_CALL],
        Expect("Look it up.", "Sure.", (PARIS,))),
    "hermes_parallel": (HERMES, OPEN, ["ok\n</think>\n\n" + HERMES_CALL + "\n" + HERMES_CALL],
                        Expect("ok", "", (PARIS, PARIS))),
    "hermes_arguments_as_text": (
        HERMES, UNOPENED, ['<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>'],
        Expect("", "", (Call("get_time", {}),))),
    "hermes_text_after_call": (HERMES, UNOPENED, [HERMES_CALL + " done"], Expect("", " done", (PARIS,))),
    "hermes_malformed_is_content": (
        HERMES, UNOPENED, ["<tool_call>{not json}</tool_call>"],
        Expect("", "<tool_call>{not json}</tool_call>", (), (K.MALFORMED_CALL,))),
    "hermes_unknown_tool_is_content": (
        HERMES, UNOPENED, ['<tool_call>{"name": "rm", "arguments": {}}</tool_call>'],
        Expect("", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>', (), (K.UNKNOWN_TOOL,))),
    "hermes_unterminated": (
        HERMES, UNOPENED, ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'],
        Expect("", "", (Call("get_weather", {"city": "Paris"}, complete=False),), (K.UNTERMINATED_CALL,))),
    "mistral_array_to_the_end": (
        MISTRAL, UNOPENED,
        ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}, '
         '{"name": "get_time", "arguments": {}}]'],
        Expect("", "", (PARIS, Call("get_time", {})))),
    "mistral_plain_answer": (MISTRAL, UNOPENED, ["It is [sunny] today."], Expect("", "It is [sunny] today.")),
    "llama_answer_is_a_call": (
        LLAMA, UNOPENED, [' {"name": "get_weather", "parameters": {"city": "Paris"}}'], Expect("", "", (PARIS,))),
    "llama_text_answer": (LLAMA, UNOPENED, ['Use {"name": 1} later.'], Expect("", 'Use {"name": 1} later.')),
    "deepseek_fenced_calls": (
        DEEPSEEK, UNOPENED, ["Checking.<｜tool▁calls▁begin｜>" + DS_CALL + "\n" + DS_CALL + "<｜tool▁calls▁end｜>"],
        Expect("", "Checking.", (PARIS, PARIS))),
    "deepseek_31_after_reasoning": (
        DEEPSEEK_31, OPEN,
        ['Paris.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
        Expect("Paris.", "", (PARIS,))),
}
QWEN_CASES = [name for name in CASES if name.startswith(("hermes", "mistral", "llama"))]
DEEPSEEK_CASES = [name for name in CASES if name.startswith("deepseek")]


def check(tokenizer, name):
    syntax, start, segments, expect = CASES[name]
    delimiters = delimiters_for(tokenizer, syntax.delimiter_spellings())
    stream = detokenize(tokenizer, encode(tokenizer, segments))
    make = lambda: OutputPipeline.create(syntax, delimiters, OutputRequest(TOOLS, "call_", OutputStart(start)))
    check_golden(make, stream, delimiters, expect, seed=name)


@pytest.mark.parametrize("name", QWEN_CASES)
def test_golden_qwen_tokenizer(qwen_tokenizer, name):
    check(qwen_tokenizer, name)


@pytest.mark.parametrize("name", DEEPSEEK_CASES)
def test_golden_deepseek_tokenizer(deepseek_tokenizer, name):
    check(deepseek_tokenizer, name)


def test_a_structured_answer_is_opaque(qwen_tokenizer):
    """A JSON answer that looks like a call stays answer text when a response format constrains it."""
    delimiters = delimiters_for(qwen_tokenizer, ())
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, [text]))
    request = OutputRequest(TOOLS, "call_", OutputStart(UNOPENED), AnswerMode.STRUCTURED)
    check_golden(lambda: OutputPipeline.create(LLAMA, delimiters, request), stream, delimiters, Expect("", text),
                 seed="structured")


@pytest.mark.parametrize("fields, path", [
    (dict(name_key="name"), "arguments_key"),
    (dict(name_key="name", arguments_key="a", invoke_open="<"), "name_key"),
    (dict(invoke_open="<call>"), "name_end"),
    (dict(), "name_key"),
])
def test_incomplete_syntax_data_is_a_contract_error(fields, path):
    with pytest.raises(ContractError, match=path):
        JsonCallSyntax(**fields)

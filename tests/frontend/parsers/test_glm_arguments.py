"""Golden tests: think tags + GLM argument tags on the real Qwen3.6 tokenizer (``<think>``,
``</think>`` and ``<tool_call>`` are single tokens there; ``<arg_key>`` is several)."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_glm_arguments, example_think_tags

from .golden import Call, Expect, Plain, check_golden, delimiters_for, detokenize, encode
from .tools import FILE_BODY, TOOLS

SYNTAX = OutputSyntax(
    ReasoningSyntaxKind.THINK_TAGS, ToolSyntaxKind.GLM_ARGUMENTS,
    think=example_think_tags(terminal="<tool_call>"), tools=example_glm_arguments(),
)
OPEN, UNOPENED, CLOSED = ReasoningState.OPEN, ReasoningState.UNOPENED, ReasoningState.CLOSED


def call(name: str, *args: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n" for key, value in args)
    return f"<tool_call>{name}\n{body}</tool_call>"


CASES = {
    "reasoning_answer_and_call": (
        UNOPENED,
        ["<think>\nLook up Paris.\n</think>\n\nLet me check.\n" + call("get_weather", ("city", "Paris"), ("days", "2"))],
        Expect("Look up Paris.", "Let me check.", (Call("get_weather", {"city": "Paris", "days": 2}),)),
    ),
    "typed_values": (
        OPEN,
        ["ok\n</think>\n" + call("get_weather", ("verbose", "false"), ("options", '{"a": 1}'), ("tags", "[]"), ("ratio", "-2e3"))],
        Expect("ok", "", (Call("get_weather", {"verbose": False, "options": {"a": 1}, "tags": [], "ratio": -2000.0}),)),
    ),
    "parallel_calls": (
        OPEN,
        ["Both.\n" + call("get_weather", ("city", "Lima")) + "\n" + call("write_file", ("path", "x"), ("content", FILE_BODY))],
        Expect("Both.", "", (Call("get_weather", {"city": "Lima"}), Call("write_file", {"path": "x", "content": FILE_BODY}))),
    ),
    "call_without_arguments": (UNOPENED, ["<tool_call>get_time</tool_call>"], Expect("", "", (Call("get_time", {}),))),
    "newline_before_name": (UNOPENED, ["<tool_call>\nget_time\n</tool_call>"], Expect("", "", (Call("get_time", {}),))),
    "name_then_key_without_separator": (
        UNOPENED, ["<tool_call>get_weather<arg_key>city</arg_key><arg_value>Kyiv</arg_value></tool_call>"],
        Expect("", "", (Call("get_weather", {"city": "Kyiv"}),)),
    ),
    "plain_close_stays_reasoning": (
        OPEN, ["a ", Plain("</think>"), " b\n</think>\n\nc"], Expect("a </think> b", "c"),
    ),
    "unknown_tool_is_content": (
        UNOPENED, ["x\n" + call("rm_rf", ("path", "/"))], Expect("", "x\n" + call("rm_rf", ("path", "/")), errors=(K.UNKNOWN_TOOL,)),
    ),
    "key_without_value": (
        UNOPENED, ["<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>"],
        Expect("", "", (Call("get_weather", {"city": "Rome"}),), (K.MALFORMED_CALL,)),
    ),
    "unterminated_value": (
        UNOPENED, ["<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>4</arg_va"],
        # no call: its text is content (`test_finish_mid_call`)
        Expect("", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>4</arg_va", errors=(K.UNTERMINATED_CALL,)),
    ),
    "key_with_surrounding_whitespace": (  # read as " days " (an undeclared string) before; vLLM strips keys
        UNOPENED, ["<tool_call>get_weather\n<arg_key> days </arg_key>\n<arg_value>3</arg_value>\n"
                   "<arg_key>\tcity </arg_key><arg_value>Oslo</arg_value>\n</tool_call>"],
        Expect("", "", (Call("get_weather", {"days": 3, "city": "Oslo"}),)),
    ),
    "key_on_its_own_line": (  # a key holding a line break was no tag: its argument was stray text, dropped
        UNOPENED, ["<tool_call>get_weather\n<arg_key>\ncity\n</arg_key>\n<arg_value>Paris</arg_value>\n"
                   "<arg_key>days\n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"],
        Expect("", "", (Call("get_weather", {"city": "Paris", "days": 2}),)),
    ),
    "key_with_line_break_and_quotes": (  # any text but a tag's "<" is a key, as vLLM's GLM parser reads it
        UNOPENED, ['<tool_call>get_weather\n<arg_key>say "hi"\nnow</arg_key>\n<arg_value>ok</arg_value>\n</tool_call>'],
        Expect("", "", (Call("get_weather", {'say "hi"\nnow': "ok"}),)),
    ),
    "invalid_boolean": (
        UNOPENED, [call("get_weather", ("verbose", "maybe"))],
        Expect("", "", (Call("get_weather", {"verbose": "maybe"}),), (K.INVALID_VALUE,)),
    ),
}


@pytest.fixture(scope="module")
def delimiters(qwen_tokenizer):
    return delimiters_for(qwen_tokenizer, SYNTAX.delimiter_spellings())


@pytest.mark.parametrize("name", CASES)
def test_golden(qwen_tokenizer, delimiters, name):
    start, segments, expect = CASES[name]
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, segments))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(start)))
    check_golden(make, stream, delimiters, expect, seed=name)

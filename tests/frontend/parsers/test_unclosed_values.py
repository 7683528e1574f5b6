"""Qwen3-Coder output that leaves out a parameter's ``</parameter>``: the value ends at the next
parameter tag or the function (or block) closer on a new line, as Qwen's and vLLM's qwen3coder parsers
read it (their value regex ends at ``</parameter>``, ``(?=<parameter=)`` or ``(?=</function>)``);
likewise an XTML argument without ``</xtml:arg>``, whose escaped value holds no tag.

Before, the value ran on to the end of the output: ``...Paris\\n</function>\\n</tool_call>`` ended
inside the value, so the whole call became content (`UNTERMINATED_CALL`), and
``<parameter=city>\\nParis\\n<parameter=days>\\n3\\n</parameter>`` gave the one value
``"Paris\\n<parameter=days>\\n3"``. Every output is fed whole, per character and in small chunks.
"""

from __future__ import annotations

import json

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters

from .golden import check_stream_invariants, control_feeds, run
from .tools import TOOLS

SYNTAX = OutputSyntax(R.THINK_TAGS, T.QWEN_CODER_FUNCTIONS, S.example_think_tags("<tool_call>"), S.example_qwen_coder())
OPEN = "<tool_call>\n<function=get_weather>\n"


def _parse(text: str, syntax: OutputSyntax = SYNTAX):
    """The result, the same for every chunking."""
    results = []
    for size in (10**6, 1, 2, 3, 7):
        pipeline = OutputPipeline.create(syntax, TokenDelimiters({}), OutputRequest(TOOLS, "c", OutputStart(ReasoningState.CLOSED)))
        outcome = run(pipeline, control_feeds({}, text, size))
        check_stream_invariants(outcome.events, outcome.result, "c")
        results.append(outcome.result)
    assert all(result == results[0] for result in results), text
    return results[0]


def _calls(result) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in result.tool_calls]


CASES = {
    "before_the_function_closer": (
        OPEN + "<parameter=city>\nParis\n</function>\n</tool_call>", {"city": "Paris"}, [K.MALFORMED_CALL],
    ),
    "before_the_next_parameter": (
        OPEN + "<parameter=city>\nParis\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        {"city": "Paris", "days": 3}, [K.MALFORMED_CALL],
    ),
    "a_typed_value_before_the_function_closer": (
        OPEN + "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</function>\n</tool_call>",
        {"city": "Paris", "days": 3}, [K.MALFORMED_CALL],
    ),
    "before_the_block_closer": (  # the function closer left out too: the call ends at the block's
        OPEN + "<parameter=city>\nParis\n</tool_call>", {"city": "Paris"}, [K.MALFORMED_CALL, K.MALFORMED_CALL],
    ),
    "an_empty_value": (
        OPEN + "<parameter=city>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        {"city": "", "days": 3}, [K.MALFORMED_CALL],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_value_without_its_closer_ends_at_the_next_tag_on_a_new_line(name):
    text, arguments, errors = CASES[name]
    result = _parse("Sure.\n\n" + text)
    assert _calls(result) == [("get_weather", arguments)]
    assert result.content == "Sure."
    assert [error.kind for error in result.errors] == errors


def test_the_next_call_after_an_unclosed_value_is_read_too():
    text = OPEN + "<parameter=city>\nParis\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
    assert _calls(_parse(text)) == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_a_tag_inside_a_line_of_a_value_stays_value_text():
    """Only a tag at a line's start ends a value: templates write values unescaped, and a value that
    names a tag within its text is not cut there."""
    value = "Use <parameter=x> and </function> or </tool_call> here"
    result = _parse(f"<tool_call>\n<function=write_file>\n<parameter=content>\n{value}\n</parameter>\n</function>\n</tool_call>")
    assert _calls(result) == [("write_file", {"content": value})]
    assert result.errors == ()


def test_an_output_ending_in_an_unclosed_value_is_still_no_call():
    text = OPEN + "<parameter=city>\nParis\n<parameter=days>\n3\n"
    result = _parse(text)
    assert _calls(result) == []
    assert result.content == text
    assert [error.kind for error in result.errors] == [K.UNTERMINATED_CALL]


XTML = OutputSyntax(R.XTML_THINK, T.XTML, S.example_xtml_think(), S.example_xtml())
XTML_OPEN = '<xtml:calls><xtml:call name="get_weather"><xtml:arg name="city">Paris'


@pytest.mark.parametrize("rest", [
    '<xtml:arg name="days">3</xtml:arg></xtml:call></xtml:calls>',
    '</xtml:call></xtml:calls>',
])
def test_an_xtml_argument_without_its_closer_ends_at_the_next_tag(rest):
    """XTML values are escaped, so a tag inside one can only follow a left-out ``</xtml:arg>``: it
    gave the value ``Paris<xtml:arg name="days">3``, or the call became content at the end."""
    result = _parse(XTML_OPEN + rest, XTML)
    expected = {"city": "Paris", "days": 3} if "days" in rest else {"city": "Paris"}
    assert _calls(result) == [("get_weather", expected)]
    assert result.content == ""
    assert [error.kind for error in result.errors] == [K.MALFORMED_CALL]

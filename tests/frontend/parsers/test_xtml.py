"""Golden tests: XTML think + XTML calls on a small trained BPE where no XTML spelling is a single
token, so every delimiter (open, close, terminal) is recognised in the text; escaped reasoning and
values are decoded."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_xtml, example_xtml_think

from .golden import Call, Expect, check_golden, delimiters_for, detokenize, encode
from .tools import FILE_BODY, TOOLS

SYNTAX = OutputSyntax(ReasoningSyntaxKind.XTML_THINK, ToolSyntaxKind.XTML, think=example_xtml_think(), tools=example_xtml())
OPEN, UNOPENED, CLOSED = ReasoningState.OPEN, ReasoningState.UNOPENED, ReasoningState.CLOSED


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def call(name: str, *args: tuple[str, str]) -> str:
    body = "".join(f'\n<xtml:arg name="{key}">{escape(value)}</xtml:arg>' for key, value in args)
    return f'<xtml:call name="{name}">{body}\n</xtml:call>'


def calls(*items: str) -> str:
    return "<xtml:calls>\n" + "\n".join(items) + "\n</xtml:calls>"


CASES = {
    "escaped_reasoning_then_answer": (
        UNOPENED, ["<xtml:think>\nIs a &lt; b &amp;&amp; c &gt; d? &#x1F9EA; &#26481;\n</xtml:think>\nYes, a < b."],
        Expect("Is a < b && c > d? 🧪 東", "Yes, a < b."),
    ),
    "unknown_entity_stays_literal": (OPEN, ["R&D &copy; &amp\n</xtml:think>\nok"], Expect("R&D &copy; &amp", "ok")),
    "terminal_opens_calls": (
        OPEN, ["Weather for two.\n" + calls(call("get_weather", ("city", "Paris"), ("days", "2")), call("write_file", ("content", FILE_BODY)))],
        Expect("Weather for two.", "", (Call("get_weather", {"city": "Paris", "days": 2}), Call("write_file", {"content": FILE_BODY}))),
    ),
    "answer_then_calls": (
        UNOPENED, ["<xtml:think>plan</xtml:think>\nCalling.\n" + calls(call("get_time"))],
        Expect("plan", "Calling.", (Call("get_time", {}),)),
    ),
    "escaped_json_value": (
        UNOPENED, [calls(call("get_weather", ("options", '{"q": "<b>"}')))],
        Expect("", "", (Call("get_weather", {"options": {"q": "<b>"}}),)),
    ),
    "open_spelled_late_is_answer_text": (UNOPENED, ["Answer first <xtml:think>not reasoning"], Expect("", "Answer first <xtml:think>not reasoning")),
    "unknown_call_is_content": (
        UNOPENED, [calls(call("nope", ("a", "1")))], Expect("", calls(call("nope", ("a", "1"))), errors=(K.UNKNOWN_TOOL,)),
    ),
    "unterminated_reasoning": (OPEN, ["still &lt;thinking"], Expect("still <thinking", "")),
}


@pytest.fixture(scope="module")
def delimiters(xtml_tokenizer):
    found = delimiters_for(xtml_tokenizer, SYNTAX.delimiter_spellings())
    assert not any(found.is_single_token(s) for s in SYNTAX.delimiter_spellings())
    return found


@pytest.mark.parametrize("name", CASES)
def test_golden(xtml_tokenizer, delimiters, name):
    start, segments, expect = CASES[name]
    stream = detokenize(xtml_tokenizer, encode(xtml_tokenizer, segments))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(start)))
    check_golden(make, stream, delimiters, expect, seed=name, num_random=40)

"""Golden tests: recipient-header frames with ATEM tool calls, on a small trained BPE whose special
tokens are the header controls ``<|start|>``, ``<|message|>`` and ``<|eom|>``."""

from __future__ import annotations

import pytest

from helios.errors import ContractError
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import (
    FramePosition, FrameStart, OutputPipeline, OutputRequest, OutputStart, TokenDelimiters,
)
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_recipients

from .golden import Call, Expect, Plain, check_golden, delimiters_for, detokenize, encode
from .tools import FILE_BODY, TOOLS

SYNTAX = OutputSyntax(ReasoningSyntaxKind.RECIPIENT_HEADERS, ToolSyntaxKind.ATEM_RECIPIENTS, frames=example_recipients())
BOUNDARY = FrameStart()


def frame(recipient: str, body: str, end: str = "<|eom|>") -> str:
    return f"<|start|>assistant to={recipient}<|message|>{body}{end}"


def invoke(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'\n<atem:parameter name="{key}">{value}</atem:parameter>' for key, value in params)
    return f'<atem:function_calls>\n<atem:invoke name="{name}">{body}\n</atem:invoke>\n</atem:function_calls>'


PARIS = invoke("get_weather", ("city", "Paris"), ("days", "3"), ("options", '{"hourly": true}'))
CASES = {
    "reasoning_then_answer": (
        BOUNDARY, [frame("self", "The user says hi. 東京 🧪"), frame("user", "Hello!", end="")],
        Expect("The user says hi. 東京 🧪", "Hello!"),
    ),
    "named_and_generic_parallel_calls": (
        BOUNDARY,
        [frame("self", "Two lookups."), frame("commentary", "Checking. "), frame("functions.get_weather", PARIS),
         frame("functions", invoke("write_file", ("path", "a.py"), ("content", FILE_BODY)))],
        Expect("Two lookups.", "Checking. ", (
            Call("get_weather", {"city": "Paris", "days": 3, "options": {"hourly": True}}),
            Call("write_file", {"path": "a.py", "content": FILE_BODY}),
        )),
    ),
    "initially_open_header": (
        FrameStart(FramePosition.HEADER, header_text="assistant"),
        [" to=self<|message|>thinking<|eom|>", frame("user", "done", end="")], Expect("thinking", "done"),
    ),
    "initially_open_reasoning_body": (
        FrameStart(FramePosition.BODY, recipient="self"), ["more thought<|eom|>", frame("user", "ok", end="")],
        Expect("more thought", "ok"),
    ),
    "plain_controls_stay_body_text": (
        BOUNDARY, [frame("self", "a x"), "<|start|>assistant to=user<|message|>use ", Plain("<|eom|>"),
                   " and ", Plain("<|start|>"), " literally"],
        Expect("a x", "use <|eom|> and <|start|> literally"),
    ),
    "named_recipient_mismatch": (
        BOUNDARY, [frame("functions.get_time", PARIS), frame("user", "sorry", end="")],
        Expect("", "sorry", errors=(K.RECIPIENT_MISMATCH,)),
    ),
    "generic_recipient_unknown_name": (
        BOUNDARY, [frame("functions", invoke("format_disk"))], Expect("", "", errors=(K.UNKNOWN_TOOL,)),
    ),
    "one_invocation_per_frame": (
        BOUNDARY, [frame("functions", PARIS + "\n" + invoke("get_time"))],
        Expect("", "", (Call("get_weather", {"city": "Paris", "days": 3, "options": {"hourly": True}}),), (K.EXTRA_INVOCATION,)),
    ),
    "unknown_recipient_dropped": (
        BOUNDARY, [frame("analysis", "secret"), frame("user", "hi", end="")], Expect("", "hi", errors=(K.UNKNOWN_RECIPIENT,)),
    ),
    "start_without_eom": (
        BOUNDARY, [frame("self", "r", end=""), frame("user", "a", end="")], Expect("r", "a", errors=(K.MISPLACED_CONTROL,)),
    ),
    "malformed_header": (
        BOUNDARY, ["<|start|>assistant<|message|>lost<|eom|>", frame("user", "ok", end="")],
        Expect("", "ok", errors=(K.MALFORMED_HEADER,)),
    ),
    "text_between_frames": (
        BOUNDARY, [frame("self", "r"), "\nstray", frame("user", "a", end="")], Expect("r", "a", errors=(K.UNEXPECTED_TEXT,)),
    ),
    "typed_scalar_invalid_and_unterminated": (
        BOUNDARY, [frame("functions.get_weather", '<atem:function_calls>\n<atem:invoke name="get_weather">\n'
                         '<atem:parameter name="days">soon</atem:parameter>\n<atem:parameter name="city">Os', end="")],
        # no call: its text is content, even in a tool frame (`test_finish_mid_call`)
        Expect("", '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="days">soon'
                   '</atem:parameter>\n<atem:parameter name="city">Os', errors=(K.UNTERMINATED_CALL,)),
    ),
}


@pytest.fixture(scope="module")
def delimiters(recipient_tokenizer):
    return delimiters_for(recipient_tokenizer, SYNTAX.delimiter_spellings())


@pytest.mark.parametrize("name", CASES)
def test_golden(recipient_tokenizer, delimiters, name):
    start, segments, expect = CASES[name]
    stream = detokenize(recipient_tokenizer, encode(recipient_tokenizer, segments))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(frame=start)))
    check_golden(make, stream, delimiters, expect, seed=name, num_random=30)


def test_header_controls_must_be_single_tokens(xtml_tokenizer):
    delimiters = delimiters_for(xtml_tokenizer, SYNTAX.delimiter_spellings())
    with pytest.raises(ContractError, match="start_control"):
        OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_"))


def test_unknown_initial_recipient_is_reported_once():
    delimiters = TokenDelimiters({"<|start|>": 1, "<|message|>": 2, "<|eom|>": 3})
    start = OutputStart(frame=FrameStart(FramePosition.BODY, recipient="nobody"))
    pipeline = OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", start))
    pipeline.feed(7, "hidden")
    pipeline.feed(3, "<|eom|>")
    pipeline.finish()
    result = pipeline.result()
    assert [e.kind for e in result.errors] == [K.UNKNOWN_RECIPIENT]
    assert result.content == "" and result.markup == "hidden<|eom|>"

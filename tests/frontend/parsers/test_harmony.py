"""Golden tests: harmony channel frames with JSON tool calls, on a small trained BPE whose special
tokens are gpt-oss's seven harmony controls. Every case also runs one token at a time, coarsest and
in random chunks (`golden.check_golden`): all feedings give the same result."""

from __future__ import annotations

import pytest

from helios.errors import ContractError
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.decoding.events import ToolCallArguments, ToolCallStart
from helios.frontend.parsers import FramePosition, FrameStart, OutputPipeline, OutputRequest, OutputStart
from helios.frontend.parsers.harmony import parse_header
from helios.frontend.decoding.syntax import ChannelSyntax, OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_harmony

from .golden import Call, Expect, Plain, check_golden, delimiters_for, detokenize, encode
from .tools import FILE_BODY, TOOLS

CHANNELS = example_harmony()
SYNTAX = OutputSyntax(ReasoningSyntaxKind.HARMONY_CHANNELS, ToolSyntaxKind.HARMONY_CHANNELS, channels=CHANNELS)
BOUNDARY = FrameStart()
HEADER = FrameStart(FramePosition.HEADER, header_text="assistant")  # the generation prompt <|start|>assistant


def frame(channel: str, body: str, end: str = "<|end|>") -> str:
    return f"<|start|>assistant<|channel|>{channel}<|message|>{body}{end}"


def call(name: str, arguments: str, end: str = "<|call|>") -> str:
    return f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}{end}"


PARIS = '{"city": "Paris", "days": 3, "options": {"hourly": true}}'
CASES = {
    "reasoning_then_final": (
        HEADER, ["<|channel|>analysis<|message|>The user says hi. 東京 🧪<|end|>", frame("final", "Hello!", end="")],
        Expect("The user says hi. 東京 🧪", "Hello!"),
    ),
    "reasoning_then_call_ended_by_eos": (
        HEADER, ["<|channel|>analysis<|message|>Look it up.<|end|>", call("get_weather", PARIS, end="")],
        Expect("Look it up.", "", (Call("get_weather", {"city": "Paris", "days": 3, "options": {"hourly": True}}),)),
    ),
    "recipient_before_channel_as_templates_render": (
        BOUNDARY, ['<|start|>assistant to=functions.write_file<|channel|>commentary json<|message|>',
                   '{"path": "a.py", "content": ' + __import__("json").dumps(FILE_BODY) + "}<|call|>"],
        Expect("", "", (Call("write_file", {"path": "a.py", "content": FILE_BODY}),)),
    ),
    "preamble_then_calls_in_turn": (
        BOUNDARY, [frame("commentary", "Checking. "), call("get_weather", PARIS), call("get_time", "{}", end="")],
        Expect("", "Checking. ", (Call("get_weather", {"city": "Paris", "days": 3, "options": {"hourly": True}}),
                                  Call("get_time", {}))),
    ),
    "final_ended_by_return": (
        BOUNDARY, [frame("final", "done", end="<|return|>")], Expect("", "done"),
    ),
    "plain_controls_stay_body_text": (
        HEADER, ["<|channel|>final<|message|>use ", Plain("<|end|>"), " and ", Plain("<|channel|>"), " literally"],
        Expect("", "use <|end|> and <|channel|> literally"),
    ),
    "initially_open_body": (
        FrameStart(FramePosition.BODY, recipient="assistant<|channel|>analysis"),
        ["more thought<|end|>", frame("final", "ok", end="")], Expect("more thought", "ok"),
    ),
    "unknown_tool": (
        BOUNDARY, [call("format_disk", "{}"), frame("final", "sorry", end="")],
        Expect("", "sorry", errors=(K.UNKNOWN_TOOL,)),
    ),
    "recipient_outside_the_namespace": (
        BOUNDARY, ["<|start|>assistant<|channel|>analysis to=browser.search<|message|>q<|call|>"],
        Expect("", "", errors=(K.UNKNOWN_RECIPIENT,)),
    ),
    "arguments_not_an_object": (
        # no call: the arguments' text is content (`test_finish_mid_call`)
        BOUNDARY, [call("get_weather", '{"city": "Par')], Expect("", '{"city": "Par', errors=(K.MALFORMED_CALL,)),
    ),
    "unknown_channel_and_missing_channel": (
        BOUNDARY, [frame("secret", "x"), "<|start|>assistant<|message|>lost<|end|>", frame("final", "ok", end="")],
        Expect("", "ok", errors=(K.MALFORMED_HEADER, K.MALFORMED_HEADER)),
    ),
    "start_inside_a_body": (
        HEADER, ["<|channel|>analysis<|message|>r", frame("final", "a", end="")],
        Expect("r", "a", errors=(K.MISPLACED_CONTROL,)),
    ),
    "text_between_frames_and_stray_controls": (
        BOUNDARY, [frame("analysis", "r"), "\nstray<|message|>", frame("final", "a", end="")],
        Expect("r", "a", errors=(K.MISPLACED_CONTROL, K.UNEXPECTED_TEXT)),
    ),
    "output_ends_inside_a_header": (
        HEADER, ["<|channel|>fin"], Expect("", "", errors=(K.MALFORMED_HEADER,)),
    ),
}


@pytest.fixture(scope="module")
def delimiters(harmony_tokenizer):
    return delimiters_for(harmony_tokenizer, SYNTAX.delimiter_spellings())


@pytest.mark.parametrize("name", CASES)
def test_golden(harmony_tokenizer, delimiters, name):
    start, segments, expect = CASES[name]
    stream = detokenize(harmony_tokenizer, encode(harmony_tokenizer, segments))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(frame=start)))
    check_golden(make, stream, delimiters, expect, seed=name, num_random=30)


def test_a_call_streams_whole_at_the_end_of_its_message(harmony_tokenizer, delimiters):
    """The call (id, name, arguments) comes when its message ends, once its arguments are known to
    be a JSON object: a call started at the header could not be taken back where they are not."""
    pipeline = OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(frame=HEADER)))
    ids = encode(harmony_tokenizer, ["<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"])
    events = [event for feed in detokenize(harmony_tokenizer, ids) for event in pipeline.feed(*feed)]
    assert not [e for e in events if isinstance(e, ToolCallStart)]
    for feed in detokenize(harmony_tokenizer, encode(harmony_tokenizer, ['{"a": 1}'])):
        assert not pipeline.feed(*feed)
    events = pipeline.finish()
    assert [e for e in events if isinstance(e, ToolCallStart)] == [ToolCallStart(0, "call_0", "get_time")]
    assert [e for e in events if isinstance(e, ToolCallArguments)] == [ToolCallArguments(0, '{"a": 1}')]


def test_headers_read_both_recipient_placements():
    generated = parse_header(CHANNELS, "assistant<|channel|>commentary to=functions.f <|constrain|>json")
    rendered = parse_header(CHANNELS, "assistant to=functions.f<|channel|>commentary json")
    assert (generated.role, generated.channel, generated.recipient, generated.content_type) == (
        "assistant", "commentary", "functions.f", "json")
    assert (rendered.role, rendered.channel, rendered.recipient) == ("assistant", "commentary", "functions.f")
    assert parse_header(CHANNELS, "functions.f to=assistant<|channel|>commentary").role == "functions.f"


def test_controls_must_be_single_tokens(xtml_tokenizer):
    delimiters = delimiters_for(xtml_tokenizer, SYNTAX.delimiter_spellings())
    with pytest.raises(ContractError, match="channel_syntax"):
        OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_"))


def test_channel_syntax_pairs_only_with_its_reasoning():
    with pytest.raises(ContractError, match="only used together"):
        OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.HARMONY_CHANNELS, channels=CHANNELS)
    with pytest.raises(ContractError, match="channel syntax data"):
        OutputSyntax(ReasoningSyntaxKind.HARMONY_CHANNELS, ToolSyntaxKind.HARMONY_CHANNELS)
    empty = ChannelSyntax(*[("" if isinstance(v, str) else v) for v in example_harmony().__dict__.values()])
    with pytest.raises(ContractError, match="must not be empty"):
        OutputSyntax(ReasoningSyntaxKind.HARMONY_CHANNELS, ToolSyntaxKind.HARMONY_CHANNELS, channels=empty)

"""Harmony channel frames: reasoning, visible content and JSON tool calls in one parser
(`ReasoningSyntaxKind.HARMONY_CHANNELS` paired with `ToolSyntaxKind.HARMONY_CHANNELS`)::

    <|start|>assistant<|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

Every spelling comes from `ChannelSyntax`. The seven controls delimit only as their tokenizer tokens
(the same spellings as plain text are body text). A header is the role, the channel after the
channel control, an optional recipient (recipient marker + name, before or after the channel) and
an optional content type after the constrain control. Reasoning channels -> `ReasoningDelta`;
content channels without a recipient -> `ContentDelta`; a recipient in the tool namespace -> one
OpenAI tool call of that function (on any channel, or none: harmony's own parser, which vLLM uses,
reads the channel as optional and a call by its recipient), its events (id, name and JSON
arguments) all when the message ends (end/call/return control, or the end of the output: the call
and return controls are normally EOS tokens, which are not fed), once its arguments are known to be
a call. Generation itself ends only at the core's EOS ids.

Recovery: text between frames -> `UNEXPECTED_TEXT` (dropped); a header with neither a channel nor a
recipient, with another role, or with an unknown channel -> `MALFORMED_HEADER`, its body dropped; a
recipient outside the tool namespace -> `UNKNOWN_RECIPIENT`, an unregistered function ->
`UNKNOWN_TOOL`, body dropped;
arguments that are not one JSON object (written so, or cut by the output's end) -> `MALFORMED_CALL`,
no call, the arguments' text is content (as JSON-call syntaxes show a block that does not parse);
a start control inside a body -> `MISPLACED_CONTROL`, the body is closed and the new header read;
other controls where they cannot delimit -> `MISPLACED_CONTROL`, dropped.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from helios.frontend.decoding.events import (
    ContentDelta,
    Event,
    MarkupDropped,
    ParseError,
    ParseErrorKind,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from helios.frontend.parsers.calls import DETAIL_LEN, CallIds
from helios.frontend.parsers.delimiters import TokenDelimiters, split_feed
from helios.frontend.parsers.start import FramePosition, FrameStart
from helios.frontend.parsers.values import ToolRegistry, parse_json
from helios.frontend.decoding.syntax import ChannelSyntax


class _S(enum.Enum):
    BOUNDARY = 1
    HEADER = 2
    BODY = 3


class _Body(enum.Enum):
    REASONING = 1
    CONTENT = 2
    TOOL = 3
    DROPPED = 4


@dataclass(frozen=True)
class Header:
    """A parsed header: empty strings for the parts it does not have."""

    role: str
    channel: str
    recipient: str
    content_type: str


def parse_header(syntax: ChannelSyntax, text: str) -> Header:
    """Reads a header's text (controls spelled inline, as the parser accumulates them)."""
    controls = f"({re.escape(syntax.channel_control)}|{re.escape(syntax.constrain_control)})"
    parts = re.split(controls, text)
    role_part, channel, content_type, free = parts[0], "", "", [parts[0]]
    for control, segment in zip(parts[1::2], parts[2::2]):
        words = segment.split()
        if control == syntax.channel_control and words and not channel:
            channel, free = words[0], free + [" ".join(words[1:])]
        elif control == syntax.constrain_control and words and not content_type:
            content_type, free = words[0], free + [" ".join(words[1:])]
        else:
            free.append(segment)
    marker = re.compile(r"(?:^|\s)" + re.escape(syntax.recipient_marker) + r"(\S+)")
    recipients = [m.group(1) for part in free for m in marker.finditer(part)]
    role_words = marker.sub(" ", role_part).split()
    role = role_words[0] if len(role_words) == 1 else ""
    return Header(role, channel, recipients[0] if len(recipients) == 1 else "", content_type)


class HarmonyParser:
    """Parses one output of harmony frames. Driven by one thread; owns its state and the open
    call's buffered arguments; ``ids`` is the pipeline's call-id allocator."""

    def __init__(self, syntax: ChannelSyntax, delimiters: TokenDelimiters, start: FrameStart,
                 tools: ToolRegistry, ids: CallIds):
        for control in syntax.controls:
            if not delimiters.is_single_token(control):
                raise ValueError(f"harmony control {control!r} is not a single tokenizer token")
        self._syntax = syntax
        self._delimiters = delimiters
        self._registry = tools
        self._ids = ids
        self._state = _S.BOUNDARY
        self._pieces: list[str] = []  # header text, or stray text between frames
        self._body = _Body.DROPPED
        self._call: str | None = None  # the function of the open tool frame
        self._arguments: list[str] = []
        self._startup: list[Event] = []
        if start.position is FramePosition.HEADER:
            self._state, self._pieces = _S.HEADER, [start.header_text]
        elif start.position is FramePosition.BODY:
            self._pieces = [start.recipient]
            self._open_body(self._startup)

    def feed(self, token_id: int, text: str) -> list[Event]:
        before, control, markup = split_feed(self._delimiters, token_id, text)
        out, self._startup = self._startup, []
        if before:
            self._text(out, before)
        if control is not None:
            self._control(out, control, markup)
        return out

    def finish(self) -> list[Event]:
        out, self._startup = self._startup, []
        if self._state is _S.BOUNDARY:
            self._flush_stray(out)
        elif self._state is _S.HEADER:
            out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, "".join(self._pieces)))
            self._pieces = []
        else:
            self._close_body(out)
        self._state = _S.BOUNDARY
        return out

    def _text(self, out: list[Event], text: str) -> None:
        if self._state is not _S.BODY:
            self._pieces.append(text)
        elif self._body is _Body.REASONING:
            out.append(ReasoningDelta(text))
        elif self._body is _Body.CONTENT:
            out.append(ContentDelta(text))
        elif self._body is _Body.TOOL:
            self._arguments.append(text)
        else:
            out.append(MarkupDropped(text))

    def _control(self, out: list[Event], control: str, markup: str) -> None:
        syntax, state = self._syntax, self._state
        ends = (syntax.end_control, syntax.call_control, syntax.return_control)
        if control == syntax.start_control:
            if state is _S.BOUNDARY:
                self._flush_stray(out)
            elif state is _S.HEADER:
                out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, "".join(self._pieces)))
            else:
                out.append(ParseError(ParseErrorKind.MISPLACED_CONTROL, f"{control} before end of message"))
                self._close_body(out)
            self._state, self._pieces = _S.HEADER, []
        elif control in (syntax.channel_control, syntax.constrain_control) and state is _S.HEADER:
            self._pieces.append(control)
        elif control == syntax.message_control and state is _S.HEADER:
            self._open_body(out)
        elif control in ends and state is not _S.BOUNDARY:
            if state is _S.HEADER:
                out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, "".join(self._pieces)))
                self._pieces = []
            else:
                self._close_body(out)
            self._state = _S.BOUNDARY
        elif control not in ends:
            out.append(ParseError(ParseErrorKind.MISPLACED_CONTROL, f"{control} outside a header"))
        if markup:
            out.append(MarkupDropped(markup))

    def _open_body(self, out: list[Event]) -> None:
        syntax = self._syntax
        text, self._pieces = "".join(self._pieces), []
        header = parse_header(syntax, text)
        self._state, self._body = _S.BODY, _Body.DROPPED
        if header.role != syntax.role or not (header.channel or header.recipient):
            out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, text))
        elif header.recipient:
            self._open_tool(out, header.recipient)
        elif header.channel in syntax.reasoning_channels:
            self._body = _Body.REASONING
        elif header.channel in syntax.content_channels:
            self._body = _Body.CONTENT
        else:
            out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, text))

    def _open_tool(self, out: list[Event], recipient: str) -> None:
        namespace = self._syntax.tool_namespace
        name = recipient[len(namespace):] if recipient.startswith(namespace) else ""
        if not name:
            out.append(ParseError(ParseErrorKind.UNKNOWN_RECIPIENT, recipient))
        elif not self._registry.has(name):
            out.append(ParseError(ParseErrorKind.UNKNOWN_TOOL, name))
        else:
            self._body, self._call, self._arguments = _Body.TOOL, name, []

    def _close_body(self, out: list[Event]) -> None:
        if self._call is not None:
            name, text = self._call, "".join(self._arguments)
            raw = text.strip()
            self._call, self._arguments = None, []
            try:
                value = parse_json(raw)  # strict: NaN and Infinity are no JSON a client reads
            except (ValueError, RecursionError):  # RecursionError: nesting too deep
                value = None
            if isinstance(value, dict):
                index, call_id = self._ids.allocate()
                out += [ToolCallStart(index, call_id, name), ToolCallArguments(index, raw), ToolCallEnd(index, True)]
            else:
                out.append(ParseError(ParseErrorKind.MALFORMED_CALL, f"{name}: {raw[:DETAIL_LEN]!r}"))
                if text:
                    out.append(ContentDelta(text))
        self._body = _Body.DROPPED

    def _flush_stray(self, out: list[Event]) -> None:
        text = "".join(self._pieces)
        self._pieces = []
        if text.strip():
            out.append(ParseError(ParseErrorKind.UNEXPECTED_TEXT, text))
        elif text:
            out.append(MarkupDropped(text))

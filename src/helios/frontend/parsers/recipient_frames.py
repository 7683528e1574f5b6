"""Recipient-header frames: reasoning, visible content and ATEM tool calls in one parser
(`ReasoningSyntaxKind.RECIPIENT_HEADERS` paired with `ToolSyntaxKind.ATEM_RECIPIENTS`)::

    <|start|>assistant to=self<|message|>REASONING<|eom|>
    <|start|>assistant to=functions.NAME<|message|><atem:function_calls>...</atem:function_calls><|eom|>
    <|start|>assistant to=functions<|message|><atem:function_calls>...</atem:function_calls><|eom|>
    <|start|>assistant to=user<|message|>ANSWER

The three header controls delimit only as their tokenizer tokens (they must be single tokens); the
same spellings as plain text are ordinary body text. End-of-message closes a frame and permits the
next header; generation itself ends only at the core's EOS ids, which are not fed to the parser.
Recipients: ``self`` -> reasoning; ``commentary`` and ``user`` -> content; the generic tool
recipient -> one ATEM invocation of any registered tool; a named tool recipient (prefix + NAME) ->
one invocation of exactly NAME (`atem`).

Recovery: text between frames -> `UNEXPECTED_TEXT` (dropped); a header that does not read ROLE
PREFIX RECIPIENT -> `MALFORMED_HEADER`, its body dropped; an unknown recipient ->
`UNKNOWN_RECIPIENT`, its body dropped; a start control inside a body -> `MISPLACED_CONTROL`, the body
is closed and the new header read; a message control outside a header -> `MISPLACED_CONTROL`,
dropped. Tool-frame problems follow `tag_tools` with nothing shown as content but the text of a
call or tool block the output ends inside (no call is returned for it).
"""

from __future__ import annotations

import enum

from helios.frontend.decoding.events import ContentDelta, Event, MarkupDropped, ParseError, ParseErrorKind, ReasoningDelta
from helios.frontend.parsers.atem import atem_grammar
from helios.frontend.parsers.calls import CallIds
from helios.frontend.parsers.delimiters import TokenDelimiters, split_feed
from helios.frontend.parsers.start import FramePosition, FrameStart
from helios.frontend.parsers.tool_grammar import NameRule, StrayText
from helios.frontend.parsers.tag_tools import TagToolParser
from helios.frontend.parsers.values import ToolRegistry
from helios.frontend.decoding.syntax import RecipientSyntax


class _S(enum.Enum):
    BOUNDARY = 1
    HEADER = 2
    BODY = 3


class _Body(enum.Enum):
    REASONING = 1
    CONTENT = 2
    TOOL = 3
    DROPPED = 4


class RecipientFrameParser:
    """Parses one output of recipient frames. Driven by one thread; owns its state and the tool
    parser of the open tool frame; ``ids`` is shared with nobody else in practice but may be."""

    def __init__(self, syntax: RecipientSyntax, delimiters: TokenDelimiters, start: FrameStart,
                 tools: ToolRegistry, ids: CallIds):
        for control in (syntax.start_control, syntax.message_control, syntax.end_message_control):
            if not delimiters.is_single_token(control):
                raise ValueError(f"header control {control!r} is not a single tokenizer token")
        self._syntax = syntax
        self._delimiters = delimiters
        self._registry = tools
        self._ids = ids
        self._state = _S.BOUNDARY
        self._pieces: list[str] = []  # header text, or stray text between frames
        self._body = _Body.DROPPED
        self._tool: TagToolParser | None = None
        self._startup: list[Event] = []  # events of the initial position, out with the first call
        if start.position is FramePosition.HEADER:
            self._state, self._pieces = _S.HEADER, [start.header_text]
        elif start.position is FramePosition.BODY:
            self._open_body(self._startup, start.recipient)

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
            out.extend(self._tool.feed(0, text))
        else:
            out.append(MarkupDropped(text))

    def _control(self, out: list[Event], control: str, markup: str) -> None:
        syntax, state = self._syntax, self._state
        if control == syntax.start_control:
            if state is _S.BOUNDARY:
                self._flush_stray(out)
            elif state is _S.HEADER:
                out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, "".join(self._pieces)))
            else:
                out.append(ParseError(ParseErrorKind.MISPLACED_CONTROL, f"{control} before end of message"))
                self._close_body(out)
            self._markup(out, markup)
            self._state, self._pieces = _S.HEADER, []
        elif control == syntax.message_control and state is _S.HEADER:
            self._markup(out, markup)
            self._open_body(out, self._recipient(out))
        elif control == syntax.end_message_control and state is not _S.BOUNDARY:
            if state is _S.HEADER:
                out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, "".join(self._pieces)))
                self._pieces = []
            else:
                self._close_body(out)
            self._markup(out, markup)
            self._state = _S.BOUNDARY
        else:
            if control == syntax.message_control:
                out.append(ParseError(ParseErrorKind.MISPLACED_CONTROL, f"{control} outside a header"))
            self._markup(out, markup)

    def _recipient(self, out: list[Event]) -> str | None:
        """The recipient the header names; None (after reporting) when it does not parse."""
        header = "".join(self._pieces)
        self._pieces = []
        expected = self._syntax.role + self._syntax.recipient_prefix
        recipient = header[len(expected) :].strip() if header.startswith(expected) else ""
        if not recipient:
            out.append(ParseError(ParseErrorKind.MALFORMED_HEADER, header))
            return None
        return recipient

    def _open_body(self, out: list[Event], recipient: str | None) -> None:
        syntax = self._syntax
        self._state, self._tool = _S.BODY, None
        named = syntax.named_tool_prefix
        if recipient is None:
            self._body = _Body.DROPPED
        elif recipient == syntax.reasoning_recipient:
            self._body = _Body.REASONING
        elif recipient in syntax.content_recipients:
            self._body = _Body.CONTENT
        elif recipient == syntax.generic_tool_recipient:
            self._open_tool(NameRule(self._registry))
        elif named and recipient.startswith(named) and len(recipient) > len(named):
            self._open_tool(NameRule(self._registry, recipient[len(named) :]))
        elif not named and self._registry.has(recipient):
            self._open_tool(NameRule(self._registry, recipient))
        else:
            out.append(ParseError(ParseErrorKind.UNKNOWN_RECIPIENT, recipient))
            self._body = _Body.DROPPED

    def _open_tool(self, names: NameRule) -> None:
        self._body = _Body.TOOL
        self._tool = TagToolParser(atem_grammar(self._syntax.tools), names, self._ids, StrayText.ERROR)

    def _close_body(self, out: list[Event]) -> None:
        if self._tool is not None:
            out.extend(self._tool.finish())
            self._tool = None
        self._body = _Body.DROPPED

    def _flush_stray(self, out: list[Event]) -> None:
        text = "".join(self._pieces)
        self._pieces = []
        if text.strip():
            out.append(ParseError(ParseErrorKind.UNEXPECTED_TEXT, text))
        elif text:
            out.append(MarkupDropped(text))

    @staticmethod
    def _markup(out: list[Event], text: str) -> None:
        if text:
            out.append(MarkupDropped(text))

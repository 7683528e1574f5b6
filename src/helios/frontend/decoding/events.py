"""Typed parser events: what output parsers emit and the presentation layer consumes.

Every output parser (`helios.frontend.parsers`) turns generated text into an ordered list of the
events below. They are immutable records; the presentation layer maps them to OpenAI JSON or SSE
deltas (`ReasoningDelta` -> ``reasoning_content``, `ContentDelta` -> ``content``, the three tool-call
events -> ``tool_calls`` entries) and ignores `MarkupDropped`. `ParseError` is a diagnostic: parsers
never raise from ``feed()``; they report malformed output with it and recover as documented in
`helios.frontend.parsers`.

Invariants a parser guarantees for one output:
- a `ToolCallStart` for ``index`` precedes its `ToolCallArguments` and exactly one `ToolCallEnd`;
  indices start at 0 and grow by one per started call;
- the argument fragments of one call concatenate to a JSON object text once its `ToolCallEnd` is out;
- concatenating deltas gives the final texts, whatever the feeding granularity was
  (`ResultBuilder` folds events into the `ParseResult` summary).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Union


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text (OpenAI ``reasoning_content``)."""

    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Visible answer text (OpenAI ``content``)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its position in ``tool_calls``, its stable id and its function name."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """The next fragment of a call's ``function.arguments`` JSON text."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """A call's arguments are final. ``complete`` is false when the output ended inside the call
    (the parser then closed its JSON object itself, see `ParseErrorKind.UNTERMINATED_CALL`)."""

    index: int
    complete: bool


@dataclass(frozen=True, slots=True)
class MarkupDropped:
    """Protocol markup consumed and not shown: delimiters, control tokens, tool tags, separators,
    a repeated close delimiter, and rejected text in places that never carry visible content."""

    text: str


class ParseErrorKind(enum.Enum):
    """What went wrong; the recovery for each is documented in `helios.frontend.parsers`."""

    UNKNOWN_TOOL = "unknown_tool"  # invocation name not registered by the request
    RECIPIENT_MISMATCH = "recipient_mismatch"  # named tool recipient with another invocation name
    MALFORMED_CALL = "malformed_call"  # tool markup that does not follow the syntax
    INVALID_VALUE = "invalid_value"  # a typed parameter value that does not parse as its type
    UNTERMINATED_CALL = "unterminated_call"  # output ended inside tool markup
    UNEXPECTED_TEXT = "unexpected_text"  # text where the syntax allows only markup
    EXTRA_INVOCATION = "extra_invocation"  # more invocations than one frame may carry
    UNKNOWN_RECIPIENT = "unknown_recipient"  # a frame addressed to nobody the syntax knows
    MALFORMED_HEADER = "malformed_header"  # a recipient header that does not parse
    MISPLACED_CONTROL = "misplaced_control"  # a header control token where it cannot delimit


@dataclass(frozen=True, slots=True)
class ParseError:
    """Malformed output, reported and recovered from. ``detail`` depends only on the output text,
    never on how it was chunked (a name, an offending value, a complete stray run, a description)."""

    kind: ParseErrorKind
    detail: str


Event = Union[
    ReasoningDelta, ContentDelta, ToolCallStart, ToolCallArguments, ToolCallEnd, MarkupDropped, ParseError
]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One OpenAI tool call as the final result holds it."""

    index: int
    call_id: str
    name: str
    arguments: str  # JSON object text
    complete: bool


@dataclass(frozen=True, slots=True)
class ParseResult:
    """Final summary of one output: what the streamed deltas add up to."""

    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[ParseError, ...]
    markup: str  # text of all MarkupDropped events (removed wrapping text is not reported)


class ResultBuilder:
    """Folds events into a `ParseResult`. Owns its accumulators; mutated only by `apply`."""

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._markup: list[str] = []
        self._calls: dict[int, list] = {}  # index -> [call_id, name, fragments, complete]
        self._errors: list[ParseError] = []

    def apply(self, events: Iterable[Event]) -> None:
        for event in events:
            self._apply_one(event)

    def _apply_one(self, event: Event) -> None:
        if isinstance(event, ReasoningDelta):
            self._reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            self._content.append(event.text)
        elif isinstance(event, MarkupDropped):
            self._markup.append(event.text)
        elif isinstance(event, ToolCallStart):
            if event.index in self._calls:
                raise ValueError(f"tool call {event.index} started twice")
            self._calls[event.index] = [event.call_id, event.name, [], False]
        elif isinstance(event, ToolCallArguments):
            self._calls[event.index][2].append(event.fragment)
        elif isinstance(event, ToolCallEnd):
            self._calls[event.index][3] = event.complete
        elif isinstance(event, ParseError):
            self._errors.append(event)
        else:
            raise TypeError(f"not a parser event: {event!r}")

    def result(self) -> ParseResult:
        calls = tuple(
            ToolCall(index, call_id, name, "".join(fragments), complete)
            for index, (call_id, name, fragments, complete) in sorted(self._calls.items())
        )
        return ParseResult(
            reasoning="".join(self._reasoning),
            content="".join(self._content),
            tool_calls=calls,
            errors=tuple(self._errors),
            markup="".join(self._markup),
        )

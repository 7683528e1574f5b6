"""Streaming one tool call's OpenAI ``arguments`` JSON object, parameter by parameter.

`CallIds` hands out call indices and stable ids for one output. `OpenCall` writes the arguments of
one started call: ``{"key": value, ...}``. A key is written when its value starts. A value typed as
a plain string is streamed as it arrives (JSON-escaped); any other value is written whole when it
ends, typed by `helios.frontend.parsers.values`. Ending a call writes the closing brace, so the
fragments of every ended call concatenate to a JSON object text. A key is written once: a repeated
parameter is `MALFORMED_CALL` and its value is dropped (the first one was streamed already).
"""

from __future__ import annotations

import enum
import json

from helios.frontend.decoding.events import (
    Event, MarkupDropped, ParseError, ParseErrorKind, ToolCallArguments, ToolCallEnd,
)
from helios.frontend.parsers.text import WrappedText, XmlEntityDecoder
from helios.frontend.parsers.values import STRING_ONLY, ValueKind, dump_json, json_value, typed_value

DETAIL_LEN = 200  # characters of an offending value quoted in a ParseError


class CallIds:
    """Indices 0, 1, ... and ids ``prefix + index`` for the calls of one output.

    The prefix should be unique per request (ids must not repeat within a conversation). Mutated
    by every parser of one pipeline, which are all driven by one thread.
    """

    def __init__(self, prefix: str):
        self._prefix = prefix
        self._next = 0

    def allocate(self) -> tuple[int, str]:
        index, self._next = self._next, self._next + 1
        return index, f"{self._prefix}{index}"


class ValueMode(enum.Enum):
    SCHEMA = "schema"  # typed by the tool's JSON schema
    RAW_STRING = "raw_string"  # declared a string by the markup
    JSON = "json"  # declared JSON by the markup


class ValueFormat(enum.Enum):
    RAW = "raw"  # value text is the value
    XML_ESCAPED = "xml_escaped"  # value text is XML-escaped (XTML)


def _escape_fragment(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class OpenCall:
    """Arguments writer of one started call. Owned by the tool parser that started the call."""

    def __init__(self, index: int, name: str, value_wrap: str, value_format: ValueFormat):
        self.index = index
        self.name = name
        self._wrap = value_wrap
        self._format = value_format
        self._num_values = 0
        self._keys: set[str] = set()
        self._is_repeat = False  # the open value's key was written before: its text is dropped
        self._key = ""
        self._mode = ValueMode.SCHEMA
        self._kinds: frozenset[ValueKind] = STRING_ONLY
        self._text: WrappedText | None = None
        self._raw: list[str] = []

    @property
    def in_value(self) -> bool:
        return self._text is not None

    def _fragment(self, text: str) -> list[Event]:
        return [ToolCallArguments(self.index, text)] if text else []

    def start_value(self, key: str, mode: ValueMode, kinds: frozenset[ValueKind]) -> list[Event]:
        decoder = XmlEntityDecoder() if self._format is ValueFormat.XML_ESCAPED else None
        self._key, self._mode, self._kinds = key, mode, kinds
        self._text = WrappedText(self._wrap, self._wrap, decoder)
        self._raw = []
        self._is_repeat = key in self._keys
        if self._is_repeat:
            return [ParseError(ParseErrorKind.MALFORMED_CALL, f"{self.name}.{key}: repeated parameter")]
        self._keys.add(key)
        opening = ("{" if self._num_values == 0 else ", ") + dump_json(key) + ": "
        self._num_values += 1
        if self._is_streamed():
            opening += '"'
        return self._fragment(opening)

    def _is_streamed(self) -> bool:
        return self._mode is ValueMode.RAW_STRING or (self._mode is ValueMode.SCHEMA and self._kinds == STRING_ONLY)

    def value_text(self, raw: str) -> list[Event]:
        if self._is_repeat:
            return [MarkupDropped(raw)] if raw else []
        text = self._text.push(raw)
        if self._is_streamed():
            return self._fragment(_escape_fragment(text))
        self._raw.append(text)
        return []

    def end_value(self) -> list[Event]:
        text = self._text.close()
        self._text = None
        if self._is_repeat:
            return []
        if self._is_streamed():
            return self._fragment(_escape_fragment(text) + '"')
        raw = "".join(self._raw) + text
        typed = json_value(raw) if self._mode is ValueMode.JSON else typed_value(raw, self._kinds)
        events = self._fragment(typed.json_text)
        if not typed.valid:
            events.append(ParseError(ParseErrorKind.INVALID_VALUE, f"{self.name}.{self._key}: {raw[:DETAIL_LEN]!r}"))
        return events

    def end(self, complete: bool) -> list[Event]:
        """Ends the call (an open value is ended first) and closes its JSON object."""
        events = self.end_value() if self.in_value else []
        events += self._fragment("}" if self._num_values else "{}")
        events.append(ToolCallEnd(self.index, complete))
        return events

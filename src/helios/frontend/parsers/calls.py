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
import secrets
import string

from helios.frontend.decoding.events import (
    Event, MarkupDropped, ParseError, ParseErrorKind, ToolCallArguments, ToolCallEnd,
)
from helios.frontend.parsers.text import WrappedText, XmlEntityDecoder
from helios.frontend.parsers.values import STRING_ONLY, ValueKind, dump_json, json_value, typed_value

DETAIL_LEN = 200  # characters of an offending value quoted in a ParseError
ID_ALPHABET = string.ascii_letters + string.digits  # of random call ids


class CallIds:
    """Indices 0, 1, ... and ids for the calls of one output.

    Ids are ``prefix + index`` (the prefix should be unique per request: ids must not repeat within
    a conversation), or, with ``random_len`` (the contract's ``tool_call_id_len``), that many random
    alphanumerics drawn per call: some chat templates (Mistral's) render only such ids, and a client
    sends a response's calls back as history. Mutated by every parser of one pipeline, which are all
    driven by one thread.
    """

    def __init__(self, prefix: str, random_len: int = 0):
        self._prefix = prefix
        self._random_len = random_len
        self._next = 0
        self._drawn: set[str] = set()

    def allocate(self) -> tuple[int, str]:
        index, self._next = self._next, self._next + 1
        if not self._random_len:
            return index, f"{self._prefix}{index}"
        call_id = self._draw()
        while call_id in self._drawn:  # distinct within the output whatever the draws
            call_id = self._draw()
        self._drawn.add(call_id)
        return index, call_id

    def _draw(self) -> str:
        return "".join(secrets.choice(ID_ALPHABET) for _ in range(self._random_len))


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

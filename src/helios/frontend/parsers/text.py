"""Chunking-independent text helpers: wrapping-text removal and XML entity decoding.

Both helpers release text as soon as no later input can change it and hold back the rest, so the
concatenation of what they release is the same however the input was split. That is the property
every parser in this package builds on.
"""

from __future__ import annotations

import re


def common_prefix_len(text: str, wrap: str) -> int:
    """Length of the longest common prefix of ``text`` and ``wrap``."""
    limit = min(len(text), len(wrap))
    index = 0
    while index < limit and text[index] == wrap[index]:
        index += 1
    return index


def strip_tail_len(text: str, wrap: str) -> int:
    """Length of the longest suffix of ``text`` that is a suffix of ``wrap`` (what closing strips)."""
    for size in range(min(len(text), len(wrap)), 0, -1):
        if wrap.endswith(text[-size:]):
            return size
    return 0


def held_tail_len(text: str, wrap: str) -> int:
    """Length of the longest suffix of ``text`` that occurs inside ``wrap``.

    Only such a suffix can still become part of a stripped tail once more text arrives; anything
    before it is final. (A longer candidate would contain a longer occurring suffix of the earlier
    text, so holding this much at every step is the same as deciding on the whole text at once.)
    """
    for size in range(min(len(text), len(wrap)), 0, -1):
        if text[-size:] in wrap:
            return size
    return 0


_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos|#[0-9]{1,8}|#x[0-9a-fA-F]{1,6});")
_ENTITY_PREFIX = re.compile(r"&(#x[0-9a-fA-F]{0,6}|#[0-9]{0,8}|[a-z]{0,4})\Z")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def _replace_entity(match: re.Match) -> str:
    body = match.group(1)
    if body in _NAMED:
        return _NAMED[body]
    code = int(body[2:], 16) if body[1] == "x" else int(body[1:])
    if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return match.group(0)  # not a character: keep the reference as text
    return chr(code)


class XmlEntityDecoder:
    """Decodes the five XML named entities and numeric character references in a text stream.

    Unknown or malformed references stay as written. A trailing ``&...`` that could still become a
    reference is held until it completes or cannot. Owns its held text only.
    """

    def __init__(self) -> None:
        self._held = ""

    def decode(self, text: str) -> str:
        text = self._held + text
        amp = text.rfind("&")
        if amp >= 0 and _ENTITY_PREFIX.match(text, amp):
            self._held, text = text[amp:], text[:amp]
        else:
            self._held = ""
        return _ENTITY.sub(_replace_entity, text)

    def finish(self) -> str:
        held, self._held = self._held, ""
        return _ENTITY.sub(_replace_entity, held)


class WrappedText:
    """A text run whose leading ``lead`` and trailing ``tail`` wrapping is removed where present.

    ``push`` returns the text that is final; ``close`` ends the run and returns the rest with the
    tail stripped. Removal: the longest common prefix with ``lead`` and then the longest suffix
    that is a suffix of ``tail``. An optional `XmlEntityDecoder` decodes the released raw text.
    """

    def __init__(self, lead: str = "", tail: str = "", decoder: XmlEntityDecoder | None = None):
        self._lead = lead
        self._tail = tail
        self._decoder = decoder
        self._lead_open = bool(lead)
        self._pending = ""  # undecided lead text, then held tail text

    def push(self, raw: str) -> str:
        if not raw:
            return ""
        text = self._pending + raw
        if self._lead_open:
            size = common_prefix_len(text, self._lead)
            if size == len(text) and size < len(self._lead):
                self._pending = text
                return ""
            self._lead_open = False
            text = text[size:]
        hold = held_tail_len(text, self._tail)
        self._pending = text[len(text) - hold :]
        return self._decode(text[: len(text) - hold])

    def close(self) -> str:
        text, self._pending = self._pending, ""
        if self._lead_open:
            self._lead_open = False
            text = text[common_prefix_len(text, self._lead) :]
        text = text[: len(text) - strip_tail_len(text, self._tail)]
        out = self._decode(text)
        if self._decoder is not None:
            out += self._decoder.finish()
        return out

    def _decode(self, text: str) -> str:
        if self._decoder is None or not text:
            return text
        return self._decoder.decode(text)

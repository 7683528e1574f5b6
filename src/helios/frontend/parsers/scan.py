"""Finding markup tags in a growing text buffer without deciding too early.

A `TagForm` is a literal prefix followed by zero or more captured values, each ended by its own
terminator literal (``<function=`` NAME ``>``; ``<｜DSML｜parameter name="`` KEY ``" string="``
FLAG ``">``). A `TagSet` finds the earliest tag of several forms in a buffer. Where a tag might
start but the buffer ends before it can be decided, the scan stops there and the caller waits for
more text, so results never depend on where the input was split. With ``final`` set (end of
output), undecidable starts are plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

# Captured values are short names or flags: no markup characters, no line breaks, bounded length.
MAX_CAPTURE_LEN = 256
FORBIDDEN_IN_CAPTURE = frozenset('<>"\n')
# A captured text between an open and a close tag (GLM's ``<arg_key>K</arg_key>``) is text, which the
# template writes verbatim: only the start of another tag ends it short.
FORBIDDEN_IN_TEXT = frozenset("<")
# A name captured up to a tag's ">" that the template writes verbatim (Qwen3-Coder's parameter names):
# quotes and line breaks are its text, but a ">" in it would end the name short.
FORBIDDEN_IN_TAG_TEXT = frozenset("<>")


@dataclass(frozen=True)
class TagForm:
    """``prefix`` then, for each terminator, a non-empty captured value ended by that terminator,
    holding none of the ``forbidden`` characters."""

    prefix: str
    terminators: tuple[str, ...] = ()
    forbidden: frozenset[str] = FORBIDDEN_IN_CAPTURE

    def __post_init__(self) -> None:
        if not self.prefix or not all(self.terminators):
            raise ValueError("tag prefix and terminators must be non-empty")


class TagMatch(NamedTuple):
    """A complete tag: its label in the `TagSet`, its span in the buffer and its captured values."""

    label: str
    start: int
    end: int
    captures: tuple[str, ...]


_NO, _PARTIAL = 0, 1


def _match_literal(buf: str, pos: int, literal: str) -> int:
    """``pos + len(literal)`` on a full match; -1 when the buffer ends inside a possible match;
    -2 when the text differs."""
    piece = buf[pos : pos + len(literal)]
    if not literal.startswith(piece):
        return -2
    return pos + len(literal) if len(piece) == len(literal) else -1


def match_form(buf: str, pos: int, form: TagForm) -> TagMatch | int:
    """The tag of ``form`` starting at ``pos``: a `TagMatch` (label empty), `_PARTIAL` or `_NO`."""
    end = _match_literal(buf, pos, form.prefix)
    if end < 0:
        return _PARTIAL if end == -1 else _NO
    captures = []
    for terminator in form.terminators:
        start = end
        while True:
            if end - start > MAX_CAPTURE_LEN:
                return _NO
            if end >= len(buf):
                return _PARTIAL
            after = _match_literal(buf, end, terminator)
            if after >= 0:
                if end == start:
                    return _NO
                captures.append(buf[start:end])
                end = after
                break
            if after == -1:
                return _PARTIAL
            if buf[end] in form.forbidden:
                return _NO
            end += 1
    return TagMatch("", pos, end, tuple(captures))


class TagSet:
    """Several labelled forms searched together. Immutable; build once per parser state."""

    def __init__(self, forms: dict[str, TagForm]):
        self._forms = tuple(forms.items())
        firsts = sorted({form.prefix[0] for form in forms.values()})
        self._starts = re.compile("[" + "".join(re.escape(c) for c in firsts) + "]")

    def find(self, buf: str, final: bool) -> tuple[int, TagMatch | None]:
        """``(safe, match)``: ``buf[:safe]`` is text no tag can claim. ``match`` is the earliest
        complete tag (starting at ``safe``), or None: then ``buf[safe:]`` is empty or must wait."""
        pos = 0
        while True:
            hit = self._starts.search(buf, pos)
            if hit is None:
                return len(buf), None
            pos = hit.start()
            undecided = False
            for label, form in self._forms:
                found = match_form(buf, pos, form)
                if isinstance(found, TagMatch):
                    return pos, found._replace(label=label)
                undecided |= found == _PARTIAL
            if undecided and not final:
                return pos, None
            pos += 1

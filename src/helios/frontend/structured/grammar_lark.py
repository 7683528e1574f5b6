"""Lark text for llguidance grammars built from syntax data: spellings, free text and string rules.

A `Spelling` is markup the grammar must generate, as pieces: text (matched by any tokenization) or
one token (generated as exactly that token). `Speller` makes spellings for one model: a declared
single-token delimiter (`TokenDelimiters`) is its token, since it delimits only when generated as
that token; any other spelling is split at the tokens llguidance treats as special, whose text no
text rule can match, so markup the tokenizer writes with a special token (``<tool_call>``) is
generated as that token and the rest as text.

`LarkRules` accumulates named rules and terminals. `text_then` builds "free text, then the first of
several stops": text stops end a lazy terminal at their first occurrence, token stops follow a
greedy terminal that cannot contain any text stop (special tokens never occur inside text), and the
escaped form (XML-escaped text, which contains no ``<`` or ``>``) is a greedy terminal followed by the
stop. `json_literal`, `regex_escape` and `not_containing` make Lark and regex text from literals.

All values here are immutable except `LarkRules`, which one grammar build owns.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Callable, Sequence

from helios.frontend.parsers.delimiters import TokenDelimiters

ANY_TEXT = "(?s:.*)"
# XML-escaped text: no raw markup characters; "&" only in the five named entities.
ESCAPED_TEXT = r"(?:[^<>&]|&(?:amp|lt|gt|quot|apos);)"
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


@dataclass(frozen=True)
class Piece:
    """Text, or one token. ``text_matches``: the token is not special to llguidance, so text rules
    could produce its text too; free text then avoids that text (the token stays the only way)."""

    text: str
    token_id: int | None = None
    text_matches: bool = False

    @property
    def is_token(self) -> bool:
        return self.token_id is not None


Spelling = tuple[Piece, ...]


def text_spelling(text: str) -> Spelling:
    return (Piece(text),) if text else ()


def join(*spellings: Spelling) -> Spelling:
    """Concatenation, adjacent text pieces merged (one literal lexeme each)."""
    out: list[Piece] = []
    for piece in itertools.chain.from_iterable(spellings):
        if out and not out[-1].is_token and not piece.is_token:
            out[-1] = Piece(out[-1].text + piece.text)
        elif piece.is_token or piece.text:
            out.append(piece)
    return tuple(out)


def spelled_text(spelling: Spelling) -> str:
    return "".join(piece.text for piece in spelling)


class Speller:
    """Spellings for one model's tokenizer. Immutable; shared by preparation workers.

    ``encode(text)`` returns ``(ids, offsets)`` without special prefix tokens; ``is_special(id)``
    says whether llguidance treats a token as special.
    """

    def __init__(self, encode: Callable[[str], tuple[Sequence[int], Sequence[tuple[int, int]]]],
                 is_special: Callable[[int], bool], delimiters: TokenDelimiters):
        self._encode = encode
        self._is_special = is_special
        self._delimiters = delimiters

    @classmethod
    def from_tokenizer(cls, tokenizer, is_special: Callable[[int], bool], delimiters: TokenDelimiters) -> Speller:
        def encode(text: str):
            encoding = tokenizer.encode(text, add_special_tokens=False)
            return encoding.ids, encoding.offsets

        return cls(encode, is_special, delimiters)

    def __call__(self, text: str) -> Spelling:
        if not text:
            return ()
        declared = self._delimiters.id_of(text)
        if declared is not None:
            return (Piece(text, declared, not self._is_special(declared)),)
        ids, offsets = self._encode(text)
        pieces: list[Spelling] = []
        start = 0
        for token_id, (begin, end) in zip(ids, offsets):
            if self._is_special(token_id):
                pieces += [text_spelling(text[start:begin]), (Piece(text[begin:end], token_id),)]
                start = end
        pieces.append(text_spelling(text[start:]))
        return join(*pieces)


def json_literal(text: str) -> str:
    """A Lark string literal (JSON escapes, non-ASCII characters as themselves)."""
    return json.dumps(text, ensure_ascii=False)


def lark_of(spelling: Spelling) -> str:
    """The Lark sequence generating ``spelling`` (empty for an empty spelling)."""
    return " ".join(f"<[{p.token_id}]>" if p.is_token else json_literal(p.text) for p in spelling)


def regex_escape(text: str) -> str:
    """``text`` as a literal inside a Lark ``/.../`` regex (Rust regex syntax)."""
    out = []
    for char in text:
        if char in _REGEX_META:
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        else:
            out.append(char)
    return "".join(out)


def _char_class(excluded: str) -> str:
    return "[^" + "".join(regex_escape(c) if c not in "]^" else "\\" + c for c in sorted(set(excluded))) + "]"


def not_containing(literal: str) -> str:
    """A regex for strings that never contain ``literal`` (unanchored body; ``(?s)`` semantics).

    Requires that the first character does not occur again in ``literal`` (true of markup closers
    such as ``</parameter>``); otherwise the first character is excluded altogether (stricter).
    """
    first, rest = literal[0], literal[1:]
    if first in rest or not rest:
        return f"{_char_class(first)}*"
    head = regex_escape(first)
    prefixes = [regex_escape(rest[:k]) for k in range(len(rest))]  # partial matches after `first`
    partial = "(?:" + "|".join(prefixes) + ")"
    exits = "|".join(f"{prefixes[k]}{_char_class(first + rest[k])}" for k in range(len(rest)))
    item = f"(?:{_char_class(first)}|(?:{head}{partial})*{head}(?:{exits}))"
    return f"{item}*(?:{head}{partial})*"


def search_regex(pattern: str) -> str | None:
    """A regex (Rust syntax, not yet escaped for Lark) that fully matches exactly the strings in
    which ``pattern`` finds a match: JSON schema's ``pattern`` is unanchored unless it spells ``^``
    or ``$``, as llguidance reads it in JSON. None when an anchor stands anywhere but at the ends of
    the pattern's top-level alternatives (llguidance regexes take no anchors inside)."""
    flags = ""
    if pattern.startswith("(?") and (close := pattern.find(")")) > 0 and ":" not in pattern[:close]:
        flags, pattern = pattern[: close + 1], pattern[close + 1 :]  # (?i) applies to every alternative
    spans, anchors = _top_level_spans(pattern)
    starts, ends = {start for start, _ in spans}, {end - 1 for _, end in spans}
    if any(depth or (pattern[at] == "^" and at not in starts) or (pattern[at] == "$" and at not in ends)
           for at, depth in anchors):
        return None
    anchored = {at for at, _ in anchors}
    branches = []
    for start, end in spans:
        head = start in anchored and pattern[start] == "^"
        tail = end - 1 in anchored and pattern[end - 1] == "$"
        inner = pattern[start + head : end - tail]
        branches.append(f"{'' if head else ANY_TEXT}(?:{flags}{inner}){'' if tail else ANY_TEXT}")
    return f"(?:{'|'.join(branches)})"


def _top_level_spans(pattern: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The [start, end) spans of the top-level alternatives, and (offset, group depth) of each
    ``^`` and ``$`` outside character classes and escapes."""
    spans, anchors = [], []
    start = depth = classes = 0
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if classes:
            classes += {"[": 1, "]": -1}.get(char, 0)  # classes nest in Rust regex syntax
        elif char == "[":
            classes, i = 1, i + 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)  # a "]" first in a class is literal
            continue
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and not depth:
            spans.append((start, i))
            start = i + 1
        elif char in "^$":
            anchors.append((i, depth))
        i += 1
    spans.append((start, len(pattern)))
    return spans, anchors


def avoiding(body: str, avoid: Sequence[Spelling]) -> str:
    """A terminal body (Lark) matching ``body`` minus text containing any of ``avoid`` (their leading
    text, and the text of tokens that text rules could produce)."""
    return _excluding(body, _avoided_texts(avoid))


class LarkRules:
    """Rules and terminals of one Lark grammar under generated unique names. Owned by one build."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._counter = itertools.count()
        self._cache: dict[tuple, str] = {}

    def rule(self, hint: str, body: str, attributes: str = "") -> str:
        """A lowercase rule ``name[attributes]: body``; returns its name."""
        return self._add(hint.lower(), body, attributes)

    def terminal(self, hint: str, body: str) -> str:
        """An uppercase terminal (one lexeme): ``NAME: body``; returns its name."""
        return self._add(hint.upper(), body, "")

    def _add(self, hint: str, body: str, attributes: str) -> str:
        key = (hint, body, attributes)
        if key in self._cache:
            return self._cache[key]
        name = f"{hint}_{next(self._counter)}"
        suffix = f"[{attributes}]" if attributes else ""
        self._lines.append(f"{name}{suffix}: {body}")
        self._cache[key] = name
        return name

    def text(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self._lines]) + "\n"


def _avoided_texts(spellings: Sequence[Spelling]) -> list[str]:
    """Texts free text must not contain: each spelling's leading text, and the text of tokens that
    text rules could produce."""
    texts = []
    for spelling in spellings:
        if spelling and not spelling[0].is_token:
            texts.append(spelling[0].text)
        texts += [piece.text for piece in spelling if piece.is_token and piece.text_matches]
    return sorted(set(t for t in texts if t))


def _excluding(body: str, texts: Sequence[str]) -> str:
    if not texts:
        return body
    alternatives = "|".join(regex_escape(text) for text in texts)
    return f"{body} & ~/{ANY_TEXT}(?:{alternatives}){ANY_TEXT}/"


def free_text(rules: LarkRules, avoid: Sequence[Spelling] = (), escaped: bool = False) -> str:
    """A terminal for non-empty text containing none of ``avoid`` (use it as ``NAME?``)."""
    if escaped:
        return rules.terminal("etext", f"/{ESCAPED_TEXT}+/")
    return rules.terminal("text", _excluding("/(?s:.+)/", _avoided_texts(avoid)))


def text_then(rules: LarkRules, stops: Sequence[Spelling], avoid: Sequence[Spelling] = (),
              escaped: bool = False) -> list[str]:
    """For each stop, a rule: text containing no stop and none of ``avoid``, then that stop.

    Text stops are found at their first occurrence; ``escaped`` text (no ``<`` or ``>``) needs
    every text stop to start with ``<`` so the text can never run into one.
    """
    out = []
    for stop in stops:
        if not stop:
            raise ValueError("a stop spelling must not be empty")
        others = [s for s in (*stops, *avoid) if s != stop]
        if escaped:
            if not stop[0].is_token and not stop[0].text.startswith("<"):
                raise ValueError(f"escaped text cannot end at {stop[0].text!r}")
            text = free_text(rules, escaped=True)
            out.append(rules.rule("upto", f"{text}? {lark_of(stop)}"))
        elif stop[0].is_token:
            text = free_text(rules, (*others, *([stop] if stop[0].text_matches else [])))
            out.append(rules.rule("upto", f"{text}? {lark_of(stop)}"))
        else:
            lazy = f"/{ANY_TEXT}{regex_escape(stop[0].text)}/"
            excluded = [t for t in _avoided_texts(others) if t not in stop[0].text]
            head = rules.rule("lazy", _excluding(lazy, excluded), "lazy")
            out.append(rules.rule("upto", " ".join(filter(None, (head, lark_of(stop[1:]))))))
    return out

"""Patterns and values of XML-escaped text, read as the parser decodes it.

An escaped tool syntax (XTML) writes string values with ``&``, ``<`` and ``>`` as ``&amp;``,
``&lt;`` and ``&gt;``, and its parser decodes them; a client's ``pattern``, ``enum`` and ``const``
speak of the decoded text, while llguidance checks the text as written. So the grammar holds the
written text to the escaped language of the decoded one:

- `escaped_search` turns a JSON-schema ``pattern`` into a regex (Rust syntax, as llguidance reads
  it) that fully matches exactly the canonical escapings of the strings in which the pattern finds
  a match: each ``&``, ``<`` and ``>`` written as its entity, every other character as itself (a
  match never starts or ends inside an entity). None for a pattern it cannot carry over exactly:
  one Python's ``re`` parser cannot read, or reads differently from llguidance (``\\p{..}``, POSIX
  classes, the ``m`` flag), or with a construct llguidance lacks (backreferences, lookaround,
  possessive repeats, word boundaries, ``^``/``$`` inside). The caller then keeps the written text
  free of ``&``, ``<`` and ``>``, so the pattern is checked on text that reads as written;
- `escaped_value` escapes the strings (and object keys) of an ``enum``/``const`` value the same way;
- `escaped_keywords` applies both to one JSON subschema, for llguidance to check the written text.

Pure functions.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Mapping

from re import _constants as sre  # noqa: the parser's opcodes (stable since Python 3.11)
from re import _parser as sre_parse

from helios.frontend.structured.grammar_lark import regex_escape

ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Entities are case-sensitive (the parser leaves "&AMP;" as written), also inside a (?i) pattern.
_ENTITY_ALTERNATIVES = {char: f"(?-i:{regex_escape(entity)})" for char, entity in ENTITIES.items()}
_SPECIAL = "".join(regex_escape(char) for char in ENTITIES)
# One decoded character as written: a plain character or one entity.
ESCAPED_CHAR = f"(?:[^{_SPECIAL}]|{'|'.join(_ENTITY_ALTERNATIVES.values())})"
_ESCAPED_LINE_CHAR = f"(?:[^\\n{_SPECIAL}]|{'|'.join(_ENTITY_ALTERNATIVES.values())})"
_CATEGORIES = {
    sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
    sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W",
}
_STARTS = (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING)
_ENDS = (sre.AT_END, sre.AT_END_STRING)
_UNSUPPORTED_FLAGS = re.ASCII | re.LOCALE | re.MULTILINE  # other classes, or anchors at every line


class _Unsupported(Exception):
    """A construct that cannot be carried over exactly."""


def escape_text(text: str) -> str:
    for char, entity in ENTITIES.items():
        text = text.replace(char, entity)
    return text


def escaped_value(value: Any) -> Any:
    """``value`` with every string and object key escaped (a copy)."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, list):
        return [escaped_value(item) for item in value]
    if isinstance(value, dict):
        return {escape_text(key): escaped_value(item) for key, item in value.items()}
    return value


def escaped_keywords(schema: dict) -> tuple[dict, bool]:
    """An escaped syntax's string keywords as llguidance checks them, on the written text: ``enum``
    and ``const`` values, declared and required property names escaped, the ``pattern`` (and
    patternProperties' key patterns) carried to the escaped language of the text the parser
    decodes (`escaped_search`). True when the written text must also hold no entity, so that
    it reads as written: llguidance counts ``minLength``/``maxLength`` and matches ``format`` on the
    characters written ("&amp;" is one character decoded), and a pattern `escaped_search` cannot
    carry over is matched as written."""
    out = dict(schema)
    if isinstance(out.get("properties"), Mapping):  # keys are JSON strings too
        out["properties"] = {escape_text(name): value for name, value in out["properties"].items()}
    if isinstance(out.get("required"), list):
        out["required"] = [escape_text(name) if isinstance(name, str) else name for name in out["required"]]
    if isinstance(out.get("patternProperties"), Mapping):
        out["patternProperties"] = {_escaped_key_pattern(key): value for key, value in out["patternProperties"].items()}
    if isinstance(out.get("enum"), list):
        out["enum"] = [escaped_value(value) for value in out["enum"]]
    if "const" in out:
        out["const"] = escaped_value(out["const"])
    as_written = any(key in out for key in ("minLength", "maxLength", "format"))
    if isinstance(out.get("pattern"), str):
        written = escaped_search(out["pattern"])
        if written is None:
            as_written = True
        else:
            out["pattern"] = f"^{written}$"
    return out, as_written


def _escaped_key_pattern(pattern: str) -> str:
    """A patternProperties key pattern for escaped keys (as written, where it cannot be carried over)."""
    written = escaped_search(pattern)
    return pattern if written is None else f"^{written}$"


def escaped_search(pattern: str) -> str | None:
    """A regex fully matching the escapings of the strings ``pattern`` finds a match in (see the
    module docstring), or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "possible nested set": a POSIX class Python reads as a set
            parsed = sre_parse.parse(pattern)
        if parsed.state.flags & _UNSUPPORTED_FLAGS:
            return None
        writer = _Writer()
        dotall = bool(parsed.state.flags & re.DOTALL)
        data = list(parsed.data)
        alternatives = data[0][1][1] if len(data) == 1 and data[0][0] is sre.BRANCH else [data]
        out = "|".join(writer.alternative(list(items), dotall) for items in alternatives)
    except (re.error, Warning, _Unsupported, RecursionError, OverflowError, ValueError, TypeError):
        return None
    return f"(?i:{out})" if parsed.state.flags & re.IGNORECASE else f"(?:{out})"


class _Writer:
    """Writes parsed regex items as the regex of their escaped language."""

    def alternative(self, items: list, dotall: bool) -> str:
        """One top-level alternative with search semantics: ``^``/``$`` only at its ends."""
        anchored_start = bool(items) and items[0][0] is sre.AT and items[0][1] in _STARTS
        anchored_end = len(items) > anchored_start and items[-1][0] is sre.AT and items[-1][1] in _ENDS
        body = self.sequence(items[anchored_start:len(items) - anchored_end], dotall)
        free = f"{ESCAPED_CHAR}*"
        return f"{'' if anchored_start else free}{body}{'' if anchored_end else free}"

    def sequence(self, items, dotall: bool) -> str:
        return "".join(self.item(op, av, dotall) for op, av in items)

    def item(self, op, av, dotall: bool) -> str:
        if op is sre.LITERAL:
            return self._literal(chr(av))
        if op is sre.NOT_LITERAL:
            return self._class([(sre.LITERAL, av)], negated=True)
        if op is sre.ANY:
            return ESCAPED_CHAR if dotall else _ESCAPED_LINE_CHAR
        if op is sre.IN:
            negated = bool(av) and av[0][0] is sre.NEGATE
            return self._class(av[1:] if negated else av, negated)
        if op is sre.BRANCH:
            return "(?:" + "|".join(self.sequence(branch, dotall) for branch in av[1]) + ")"
        if op is sre.SUBPATTERN:
            _, added, removed, items = av
            if (added | removed) & _UNSUPPORTED_FLAGS:
                raise _Unsupported("ASCII, LOCALE or MULTILINE flags")
            if added & re.DOTALL or removed & re.DOTALL:
                dotall = bool(added & re.DOTALL)
            body = self.sequence(items, dotall)
            case = ("i" if added & re.IGNORECASE else "") + ("-i" if removed & re.IGNORECASE else "")
            return f"(?{case}:{body})"
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # lazy or greedy: the same strings match whole
            low, high, items = av
            count = f"{{{low},}}" if high == sre.MAXREPEAT else f"{{{low},{high}}}"
            return f"(?:{self.sequence(items, dotall)}){count}"
        raise _Unsupported(str(op))  # anchors inside, lookaround, possessive repeats, atomic groups

    @staticmethod
    def _literal(char: str) -> str:
        return _ENTITY_ALTERNATIVES.get(char) or _class_char(char, outside=True)

    @staticmethod
    def _class(items, negated: bool) -> str:
        parts, members = [], set()
        for op, av in items:
            if op is sre.LITERAL:
                parts.append(_class_char(chr(av)))
                members |= {char for char in ENTITIES if ord(char) == av}
            elif op is sre.RANGE:
                low, high = av
                parts.append(f"{_class_char(chr(low))}-{_class_char(chr(high))}")
                members |= {char for char in ENTITIES if low <= ord(char) <= high}
            elif op is sre.CATEGORY and av in _CATEGORIES:
                parts.append(_CATEGORIES[av])
                members |= {char for char in ENTITIES if re.fullmatch(_CATEGORIES[av], char)}
            else:
                raise _Unsupported(f"class item {op}")
        body = "".join(parts)
        if negated:
            members = set(ENTITIES) - members
            plain = f"[^{body}{_SPECIAL}]"
        elif all(op is sre.LITERAL and chr(av) in ENTITIES for op, av in items):
            plain = ""  # only special characters: each is its entity
        else:
            plain = f"[{body}&&[^{_SPECIAL}]]"
        choices = [plain] * bool(plain) + [_ENTITY_ALTERNATIVES[char] for char in sorted(members)]
        if not choices:
            raise _Unsupported("an empty class")
        return choices[0] if len(choices) == 1 else f"(?:{'|'.join(choices)})"


def _class_char(char: str, outside: bool = False) -> str:
    """``char`` as a regex literal (inside a class unless ``outside``)."""
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{{{ord(char):X}}}"
    if outside:
        return regex_escape(char)
    return "\\" + char if char in "\\]^-[&~" else char

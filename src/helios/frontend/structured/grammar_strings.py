"""The text a raw string tool parameter may hold, gathered from wherever its schema says it.

A parameter the parsers read as a plain string is written as raw text (`grammar_values`), held to
``minLength``, ``maxLength``, ``pattern`` and its string ``enum``/``const`` values. JSON Schema lets
those keywords sit behind a local ``$ref`` (the ref's siblings laid over its target), in ``allOf``
branches (each holds) and in ``anyOf``/``oneOf`` branches (one holds); `raw_string` gathers them
into one `RawString`, so none is dropped:

- ``allOf``: value sets intersect, the largest ``minLength`` and the smallest ``maxLength`` hold,
  and every pattern holds (their number is bounded by `grammar_shapes`);
- ``anyOf``/``oneOf`` (``oneOf`` read as ``anyOf``, as llguidance's lenient JSON values read it):
  alternatives that are all value sets give their union; an alternative without constraints leaves
  the text free, a value set whose values a bounded alternative admits adds nothing, length ranges
  that meet give one range; other differently bounded alternatives
  cannot be one raw-text lexeme, a `GrammarError`
  (HTTP 400 naming the parameter) rather than a bound silently dropped;
- values the bounds reject are left out (patterns searched with Python's ``re``).

A ``$ref`` already being followed (a recursion such as ``A = anyOf[A, {"maxLength": 3}]``) adds
nothing: the least fixed point, as the parsers' typing reads it. Pure functions over the schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.structured.grammar import GrammarError


@dataclass(frozen=True)
class StringBounds:
    """The keywords a raw string value is held to: ``minLength``, ``maxLength``, ``pattern``s."""

    min_len: int = 0
    max_len: int | None = None
    patterns: tuple[str, ...] = ()

    @property
    def is_prefix_closed(self) -> bool:
        """Whether every prefix of an allowed value is allowed (a maxLength alone)."""
        return self.min_len == 0 and not self.patterns

    def meet(self, other: StringBounds) -> StringBounds:
        """Both bounds at once."""
        highs = [high for high in (self.max_len, other.max_len) if high is not None]
        patterns = self.patterns + tuple(p for p in other.patterns if p not in self.patterns)
        return StringBounds(max(self.min_len, other.min_len), min(highs) if highs else None, patterns)

    def admits(self, text: str) -> bool:
        """Whether ``text`` meets the bounds (a pattern Python's ``re`` cannot read admits it)."""
        if len(text) < self.min_len or (self.max_len is not None and len(text) > self.max_len):
            return False
        return all(_searches(pattern, text) for pattern in self.patterns)


@dataclass(frozen=True)
class RawString:
    """A raw string value's constraints: its allowed values (None: any text) and its bounds."""

    literals: tuple[str, ...] | None = None
    bounds: StringBounds = StringBounds()

    def meet(self, other: RawString) -> RawString:
        if self.literals is None or other.literals is None:
            literals = self.literals if other.literals is None else other.literals
        else:
            literals = tuple(text for text in self.literals if text in other.literals)
        return RawString(literals, self.bounds.meet(other.bounds))

    def allowed_literals(self) -> tuple[str, ...] | None:
        """The values the bounds also admit (None: any text within the bounds)."""
        if self.literals is None:
            return None
        return tuple(text for text in self.literals if self.bounds.admits(text))


FREE = RawString()


def raw_string(schema: Any, document: SchemaDocument, visiting: frozenset[str] = frozenset()) -> RawString:
    """The constraints of a string-only (sub)schema of ``document`` (see the module docstring);
    GrammarError for an ``anyOf``/``oneOf`` of differently bounded alternatives."""
    gathered = _gather(schema, document, visiting)
    return FREE if gathered is None else gathered


def _gather(schema: Any, document: SchemaDocument, visiting: frozenset[str]) -> RawString | None:
    """None: a ref already being followed (it adds nothing)."""
    followed = document.follow(schema, visiting)
    if followed is None:
        return None
    schema, visiting = followed
    if not isinstance(schema, Mapping):
        return FREE
    out = _own(schema)
    for branch in _branches(schema, "allOf"):
        gathered = _gather(branch, document, visiting)
        if gathered is not None:
            out = out.meet(gathered)
    for key in ("anyOf", "oneOf"):
        if _branches(schema, key):
            out = out.meet(_either(_branches(schema, key), document, visiting))
    return out


def _own(schema: Mapping) -> RawString:
    values = list(schema["enum"]) if isinstance(schema.get("enum"), list) else None
    if "const" in schema:
        values = [schema["const"]] if values is None else [v for v in values if v == schema["const"]]
    literals = None if values is None else tuple(dict.fromkeys(v for v in values if isinstance(v, str)))
    low, high, pattern = schema.get("minLength"), schema.get("maxLength"), schema.get("pattern")
    bounds = StringBounds(low if _is_count(low) else 0, high if _is_count(high) else None,
                          (pattern,) if isinstance(pattern, str) else ())
    return RawString(literals, bounds)


def _either(branches: list, document: SchemaDocument, visiting: frozenset[str]) -> RawString:
    options = [option for option in (_gather(branch, document, visiting) for branch in branches) if option is not None]
    if not options:
        return FREE
    if all(option.literals is not None for option in options):
        literals = tuple(dict.fromkeys(text for option in options for text in option.allowed_literals()))
        return RawString(literals)
    if any(option == FREE for option in options):
        return FREE
    options = _without_subsumed(options)
    first = options[0]
    if all(replace(option, literals=None) == replace(first, literals=None) for option in options):
        return RawString(None, first.bounds)  # one bound, some alternatives also listing values
    lengths = _length_union([option.bounds for option in options if option.literals is None])
    if lengths is not None and all(option.literals is None for option in options):
        return RawString(None, lengths)
    raise GrammarError("its anyOf/oneOf alternatives bound the text differently (minLength, maxLength, pattern), "
                       "which a raw string value cannot hold; give the bounds at the parameter's top level or in "
                       "allOf")


def _without_subsumed(options: list[RawString]) -> list[RawString]:
    """``options`` less the value sets whose every value a bounded alternative already admits
    (``anyOf: [{"maxLength": 4}, {"const": "ab"}]`` is the maxLength alone). A bound with a pattern
    Python's ``re`` cannot read admits nothing here: its verdict on a value is unknown."""
    bounded = [option.bounds for option in options
               if option.literals is None and all(map(_readable, option.bounds.patterns))]

    def subsumed(option: RawString) -> bool:
        return option.literals is not None and all(any(bound.admits(text) for bound in bounded)
                                                   for text in option.allowed_literals())

    return [option for option in options if not subsumed(option)]


def _readable(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def _length_union(bounds: list[StringBounds]) -> StringBounds | None:
    """One length range holding exactly the lengths of ``bounds`` (no patterns), or None."""
    if any(bound.patterns for bound in bounds):
        return None
    ranges = sorted((bound.min_len, bound.max_len) for bound in bounds)
    low, high = ranges[0]
    for start, end in ranges[1:]:
        if high is not None and start > high + 1:
            return None  # a gap between the ranges
        high = None if high is None or end is None else max(high, end)
    return StringBounds(low, high)


def _branches(schema: Mapping, key: str) -> list:
    branches = schema.get(key)
    return branches if isinstance(branches, list) else []


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _searches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except (re.error, RecursionError, OverflowError):
        return True

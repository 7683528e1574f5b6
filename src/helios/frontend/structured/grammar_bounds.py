"""Number ranges llguidance's JSON compiler writes wrongly, found before it sees them.

llguidance (1.9) turns a number schema's merged bounds into a regex. Where both bounds share their
integer part, it writes that integer part with an optional fraction after it, whether or not the
bound that equals it is exclusive: ``{"exclusiveMinimum": 0, "maximum": 0.5}`` let ``0`` through,
``{"exclusiveMinimum": 10, "exclusiveMaximum": 10.5}`` let ``10``, and on the negative side
``{"exclusiveMinimum": -0.5, "exclusiveMaximum": 0}`` let ``-0`` (0) and ``(-1.5, -1)`` let ``-1``.
(A differential check of 931 bound pairs over 1,000 numbers found no other value outside its range.)
Draft 4's spelling, ``minimum`` with ``exclusiveMinimum: true`` (and ``maximum`` with
``exclusiveMaximum: true``), is an exclusive bound too: llguidance honours it and writes it as wrongly.
`exclusive_bound_error` refuses such a range with a 400 naming the keyword and its place.

Bounds merge as llguidance merges them: a schema's own keywords with those of its ``allOf``
branches and ``$ref`` targets, and those with each ``anyOf``/``oneOf`` branch (it distributes the
conjunction over the alternatives); properties of the same name in the merged schemas, and their
``items``, merge with each other. Properties named by an ``anyOf`` branch are not merged with the
schemas around it (a branch is checked with the bounds around it only). The walk is bounded
(`MAX_BOUND_VISITS`, and Python's recursion limit: cycles of $refs whose lengths share no factor
make a new merged set at every level); past either bound it passes the schema.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, NamedTuple

from helios.errors import RequestError
from helios.frontend.parsers.schema_refs import SchemaDocument

MAX_BOUND_VISITS = 20_000  # merged schemas one check looks at (each a handful of dict reads)


class Bounds(NamedTuple):
    """A merged number range: None for an open side; `low_keyword`/`high_keyword` name where the
    bound came from (for the client's error)."""

    low: float | None = None
    low_exclusive: bool = False
    low_keyword: str = ""
    high: float | None = None
    high_exclusive: bool = False
    high_keyword: str = ""

    def merged(self, node: dict, path: str) -> Bounds:
        """These bounds narrowed by the bound keywords of ``node`` (at JSON pointer ``path``)."""
        low, low_x, low_k, high, high_x, high_k = self
        for key, exclusive in (("minimum", node.get("exclusiveMinimum") is True), ("exclusiveMinimum", True)):
            value = node.get(key)
            if _is_finite(value) and (low is None or value > low or (value == low and exclusive and not low_x)):
                low, low_x, low_k = value, exclusive, f"{_spelled(key, exclusive)} {value!r} at {path or '/'}"
        for key, exclusive in (("maximum", node.get("exclusiveMaximum") is True), ("exclusiveMaximum", True)):
            value = node.get(key)
            if _is_finite(value) and (high is None or value < high or (value == high and exclusive and not high_x)):
                high, high_x, high_k = value, exclusive, f"{_spelled(key, exclusive)} {value!r} at {path or '/'}"
        return Bounds(low, low_x, low_k, high, high_x, high_k)

    def miswritten(self) -> str:
        """The keyword whose exclusive bound llguidance would let through ("" when none)."""
        low, high = self.low, self.high
        if low is None or high is None or not low < high:
            return ""  # open, or empty: llguidance refuses an empty range itself
        if self.low_exclusive and low >= 0 and low == math.floor(low) and high < low + 1:
            return self.low_keyword
        if self.high_exclusive and high <= 0 and high == math.floor(high) and low > high - 1:
            return self.high_keyword
        return ""


def exclusive_bound_error(schema: Any, document: SchemaDocument) -> str:
    """Why a number range of ``schema`` is one llguidance writes wrongly (its error for a client),
    or "" when none is (or the walk ran past `MAX_BOUND_VISITS`)."""
    walk = _BoundWalk(document)
    try:
        return walk.check([(schema, "")], Bounds())
    except (_TooLong, RecursionError):  # recursive $refs can keep making new merged sets, one level each
        return ""


class _TooLong(Exception):
    pass


class _BoundWalk:
    def __init__(self, document: SchemaDocument):
        self._document = document
        self._visits = 0
        self._seen: set[tuple] = set()

    def check(self, nodes: list[tuple[Any, str]], bounds: Bounds) -> str:
        """The error for the merged schemas ``nodes`` ((schema, path) pairs) under ``bounds``."""
        members = list(self._conjunction(nodes))
        key = (tuple(sorted(id(node) for node, _ in members)), bounds)
        if key in self._seen or not members:
            return ""
        self._seen.add(key)
        self._visits += 1
        if self._visits > MAX_BOUND_VISITS:
            raise _TooLong
        for node, path in members:
            bounds = bounds.merged(node, path)
        keyword = bounds.miswritten() if all(_may_be_number(node) for node, _ in members) else ""
        if keyword:
            other = bounds.high_keyword if keyword == bounds.low_keyword else bounds.low_keyword
            value = bounds.low if keyword == bounds.low_keyword else bounds.high
            return (f"{keyword} with {other}: a number range whose exclusive bound is an integer within 1 of "
                    f"its other bound cannot be enforced exactly (llguidance would let {value!r} itself "
                    "through); use a minimum or maximum just past it, such as 0.000001 for an exclusive 0")
        for node, path in members:
            for word in ("anyOf", "oneOf"):
                branches = node.get(word)
                for index, branch in enumerate(branches if isinstance(branches, list) else ()):
                    error = self.check([(branch, f"{path}/{word}/{index}")], bounds)
                    if error:
                        return error
        for children in self._merged_children(members):
            error = self.check(children, Bounds())
            if error:
                return error
        return ""

    def _conjunction(self, nodes: list[tuple[Any, str]]) -> Iterator[tuple[dict, str]]:
        """The schemas merged with ``nodes``: themselves, their allOf branches and $ref targets."""
        stack, seen = list(nodes), set()
        while stack:
            node, path = stack.pop()
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            yield node, path
            branches = node.get("allOf")
            for index, branch in enumerate(branches if isinstance(branches, list) else ()):
                stack.append((branch, f"{path}/allOf/{index}"))
            ref = node.get("$ref")
            if isinstance(ref, str):
                try:
                    stack.append((self._document.resolve(ref), ref.lstrip("#") or "/"))
                except RequestError:
                    pass  # the compile reports a bad $ref

    @staticmethod
    def _merged_children(members: list[tuple[dict, str]]) -> Iterator[list[tuple[Any, str]]]:
        """The subschemas of merged values: same-named properties together, items together, ..."""
        groups: dict[tuple, list[tuple[Any, str]]] = {}
        for node, path in members:
            for word in ("properties", "patternProperties"):
                value = node.get(word)
                for name, child in (value.items() if isinstance(value, dict) else ()):
                    groups.setdefault((word, name), []).append((child, f"{path}/{word}/{_token(name)}"))
            for word in ("items", "additionalProperties"):
                if isinstance(node.get(word), dict):
                    groups.setdefault((word,), []).append((node[word], f"{path}/{word}"))
            prefix = node.get("prefixItems")
            for index, child in enumerate(prefix if isinstance(prefix, list) else ()):
                groups.setdefault(("prefixItems", index), []).append((child, f"{path}/prefixItems/{index}"))
        yield from groups.values()


def _spelled(key: str, exclusive: bool) -> str:
    """A bound keyword as the client wrote it: draft 4's ``minimum`` made exclusive by
    ``exclusiveMinimum: true`` (which llguidance honours) names both."""
    if key in ("minimum", "maximum") and exclusive:
        return f"{key} (with exclusive{key.capitalize()} true)"
    return key


def _may_be_number(node: dict) -> bool:
    kind = node.get("type")
    if isinstance(kind, str):
        return kind == "number"
    return "number" in kind if isinstance(kind, list) else True


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _token(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")

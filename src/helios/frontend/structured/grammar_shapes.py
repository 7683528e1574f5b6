"""JSON-schema shapes llguidance compiles in time (or native stack) far past their size, refused
before it sees them.

llguidance's `LIMITS` bound grammar size and lexer states, but some shapes cost work no limit stops
(checks without fuel, automata whose size is a number in the schema): a 41-byte ``multipleOf`` or a
55 kB nest of self-referencing ``anyOf`` held a preparation worker for seconds to minutes, and a
long chain of ``$ref``s overflows a native stack (`MAX_REF_DEPTH`). The
grammar check (`helios.frontend.structured.grammar.GrammarCompiler.check`) asks `schema_shape_error`
first and answers such a schema with a 400; the bounds below are set so that realistic schemas
(recursive UI trees, tools of hundreds of properties, unions of a hundred models) stay within them.
Measured on a 2-core machine, llguidance 1.9: cheap whatever their size within the 64 KiB schema
bound, hence unbounded here, are long enums, ``minLength``/``maxLength``/``minItems``/``maxItems``
of any size, number bounds, ref chains within `MAX_REF_DEPTH` and ``allOf`` of many objects. Number
bounds and ``multipleOf`` values llguidance reads inexactly are refused here too (`number_error`), as
are number ranges it writes wrongly (`grammar_bounds`), and a ``minProperties`` that only undeclared
keys, which llguidance may repeat, could meet (`distinct_keys_error`), and a ``pattern`` ending in a
lone backslash, which llguidance drops rather than refuses (`dangling_escape_error`).
"""

from __future__ import annotations

import decimal
import json
import math
from typing import Any, Iterator

from helios.errors import RequestError
from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.structured.grammar_bounds import exclusive_bound_error

# Schema shapes llguidance's JSON compiler checks without fuel, in time that grows much faster than
# the schema (a 60 kB schema held a worker for minutes), so `LIMITS` cannot bound them and the check
# refuses them first (`schema_shape_error`): the patternProperties of one object (each pair is proved
# disjoint: 300 took seconds) and the patterns one string must match together (its own, its allOf
# branches' and their refs' are intersected: 20 took seconds, 50 minutes).
MAX_PATTERN_PROPERTIES = 64
MAX_JOINT_PATTERNS = 8
# Two more, whose cost grows with a number rather than the schema's size: the alternatives of one
# anyOf/oneOf (nested ones counted in, as llguidance flattens them; not through refs) that hold a
# $ref (a 600-way self-referencing anyOf took seconds to construct and mask, 64 x 64 nested ones
# a minute: 55 kB), and the least common multiple of the schema's multipleOf values, each scaled
# to an integer past its decimals (the number automaton has about that many states: 999983 alone, 41
# bytes, took 15 s; four values near 1000 in one anyOf, minutes). Alternatives without a $ref,
# long enums, length and item bounds, ref chains and allOf of objects stay cheap; none is bounded.
MAX_REF_ALTERNATIVES = 128
MAX_MULTIPLE_OF = 10_000
# And one that costs native stack, not time: llguidance compiles a schema recursively, one frame
# chain per level of nesting, and $refs nest without the 32 levels a schema's own JSON text may
# have; a chain of 1200 refs (`{"items": {"$ref": next}}`, 50 kB) overflowed an 8 MiB stack, which
# kills the process (the engine process recompiles each admitted grammar on its main thread).
# Recursion (a ref back into its own path) adds no depth: llguidance keeps it a rule.
MAX_REF_DEPTH = 128
# And numbers llguidance reads inexactly (`number_error`): bounds and enum/const integers (it reads
# them as 64-bit floats, exact for integers up to 2**53, and builds no range from 1e18 on; the error
# was its own text, or a rounded bound or value let a wrong value through) and multipleOf values
# that scale to an integer only past 1e15 (matched llguidance's own refusal on 399 of 399 random
# decimals).
MAX_NUMBER_BOUND = 2**53
MAX_SCALED_MULTIPLE = 1e15
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

# The keywords whose subschemas llguidance compiles, in strict and lenient mode alike (keywords it
# does not implement, such as ``not``, ``if`` or ``propertyNames``, are errors in strict mode and
# ignored in lenient mode; vendor ``x-*`` keys are never schemas): a subschema, or a list of them
# (``additionalItems``: the items after a draft-4 tuple's ``items`` list, which llguidance compiles; left
# out, a multipleOf of 99991 there passed the check and took 1.4 s to compile, and its patterns were never
# probed)...
SUBSCHEMA_KEYS = frozenset({"items", "prefixItems", "additionalItems", "additionalProperties", "anyOf", "oneOf",
                            "allOf"})
# ...or a map of them (``$defs``, ``definitions``: also those no ``$ref`` reaches, whose patterns
# llguidance never compiles; a bad regex there is an error in the client's schema all the same).
SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def schema_shape_error(source: str) -> str:
    """Why the JSON schema `source` is past `MAX_PATTERN_PROPERTIES`, `MAX_JOINT_PATTERNS`,
    `MAX_REF_ALTERNATIVES`, `MAX_MULTIPLE_OF` or `MAX_REF_DEPTH`, or holds a number llguidance reads
    inexactly (`number_error`, naming the keyword's place), as its error for a client; "" when it is
    within them (or unreadable: the compile reports that)."""
    try:
        schema = json.loads(source)
        document = SchemaDocument(schema)
    except (ValueError, RequestError):
        return ""  # the compile reports an unreadable schema or a bad $ref
    joint, alternatives, multiple = _JointPatterns(document), _RefAlternatives(), 1
    stack = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        extra = node.get("patternProperties")
        if isinstance(extra, dict) and len(extra) > MAX_PATTERN_PROPERTIES:
            return (f"an object schema with {len(extra)} patternProperties: at most {MAX_PATTERN_PROPERTIES} "
                    "can be compiled in bounded time")
        ways = alternatives.count(node)
        if ways > MAX_REF_ALTERNATIVES:
            return (f"an anyOf/oneOf with {ways} alternatives that hold a $ref (nested anyOf/oneOf counted in): "
                    f"at most {MAX_REF_ALTERNATIVES} can be compiled in bounded time")
        multiple = math.lcm(multiple, _scaled_multiple(node.get("multipleOf")))
        if multiple > MAX_MULTIPLE_OF:
            return (f"multipleOf values whose least common multiple is {_short_number(multiple)} (each scaled to an "
                    f"integer past its decimals): at most {MAX_MULTIPLE_OF} can be compiled in bounded time")
        number = number_error(node, path) or distinct_keys_error(node, path) or _pattern_escape_error(node, path)
        if number:
            return number
        count = joint.count(node)
        if count is None or count > MAX_JOINT_PATTERNS:
            return (f"a string must match {'too many' if count is None else count} patterns together (its own "
                    f"pattern and those of its allOf branches): at most {MAX_JOINT_PATTERNS} can be intersected "
                    "in bounded time")
        for key, value in node.items():
            if key in SUBSCHEMA_MAPS and isinstance(value, dict):
                stack.extend((child, f"{path}/{key}/{_pointer_token(name)}") for name, child in value.items())
            elif key in SUBSCHEMA_KEYS and isinstance(value, list):
                stack.extend((child, f"{path}/{key}/{index}") for index, child in enumerate(value))
            elif key in SUBSCHEMA_KEYS:
                stack.append((value, f"{path}/{key}"))
    if _RefDepth(document).depth(schema) is None:
        return (f"a schema nested more than {MAX_REF_DEPTH} levels deep through its $refs: at most "
                f"{MAX_REF_DEPTH} can be compiled safely")
    return exclusive_bound_error(schema, document)  # within MAX_REF_DEPTH: the walk's recursion is bounded


def number_error(node: dict, path: str = "") -> str:
    """Why a number keyword of the schema ``node`` (at JSON pointer ``path``) cannot be enforced
    exactly (its error for a client), or "". llguidance reads numbers as 64-bit floats: a bound past
    `MAX_NUMBER_BOUND` may be rounded (``minimum: 2**53 + 1`` let 2**53 through) and from 1e18 on it
    builds no range at all; an integer in an ``enum``/``const`` past it may be written rounded
    (``enum: [2**53 + 1]`` wrote 2**53); a ``multipleOf`` it scales to an integer by powers of ten in
    floating point, which fails past `MAX_SCALED_MULTIPLE` (``9e-10`` does, ``3e-10`` does not), and
    a negative one, which JSON Schema does not allow, it read as its absolute value."""
    where = f" at {path}" if path else ""
    for key in BOUND_KEYWORDS:
        value = node.get(key)
        if _is_number(value) and not abs(value) <= MAX_NUMBER_BOUND:  # also an infinity or NaN
            return (f"{key} {_short_bound(value)}{where}: a number bound must be within -{MAX_NUMBER_BOUND} .. "
                    f"{MAX_NUMBER_BOUND} (2**53, past which 64-bit floats skip integers) to be enforced exactly")
    for key in ("enum", "const"):
        values = node.get(key, []) if key == "enum" else [node[key]] if key in node else []
        big = next((v for v in _integers_in(values) if abs(v) > MAX_NUMBER_BOUND), None)
        if big is not None:
            return (f"{key} value {_short_bound(big)}{where}: an integer in an enum or const must be within "
                    f"-{MAX_NUMBER_BOUND} .. {MAX_NUMBER_BOUND} (2**53) to be written exactly")
    value = node.get("multipleOf")
    if _is_number(value) and value < 0:  # llguidance read it as its absolute value; 0 it refuses itself
        return f"multipleOf {_short_bound(value)}{where}: it must be greater than 0"
    if _is_number(value) and value > 0 and _float_scaled(value) > MAX_SCALED_MULTIPLE:
        return (f"multipleOf {_short_bound(value)}{where}: it must become an integer of at most 16 digits "
                "when scaled by a power of ten in 64-bit floating point to be enforced (a decimal with fewer "
                "places, such as 0.5 or 1e-6, does)")
    return ""


def distinct_keys_error(node: dict, path: str = "") -> str:
    """Why the ``minProperties`` of the object schema ``node`` (at JSON pointer ``path``) cannot be
    enforced (its error for a client), or "". llguidance writes each declared property at most once
    but keeps no set of the undeclared keys it wrote (``additionalProperties``, ``patternProperties``),
    so it may write one twice (``{"k": 1, "k": 2}``) and count it twice toward ``minProperties``;
    a JSON parser reads one key (the last value: the tool-call parsers, Python, JavaScript), and some
    refuse the text. Undeclared keys are distinct only where at most one is needed, so a minimum
    above the required declared properties plus one is refused rather than left unenforced."""
    least = node.get("minProperties")
    extra = node.get("patternProperties")
    if not _is_number(least) or node.get("additionalProperties", True) is False and not extra:
        return ""
    declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = node.get("required") if isinstance(node.get("required"), list) else []
    needed = least - len({key for key in required if isinstance(key, str) and key in declared})
    if needed < 2:
        return ""
    where = f" at {path}" if path else ""
    return (f"minProperties {_short_bound(least)}{where}: an object that takes undeclared keys may be written with "
            "one of them twice, which JSON parsers read as one key, so it can count at most one undeclared key "
            "toward minProperties; declare the properties it needs (and require them) or lower minProperties")


def dangling_escape_error(pattern: str, what: str = "the regex") -> str:
    """Why the regex `pattern` is malformed in a way llguidance does not report (its error for a
    client, naming it `what`), or "": a pattern ending in a lone backslash (after an odd number of
    them), an escape with nothing to escape, which llguidance drops instead of refusing, so
    ``^a\\`` constrained the output as ``^a`` and a lone ``\\`` as the empty regex (any text)."""
    if (len(pattern) - len(pattern.rstrip("\\"))) % 2 == 0:
        return ""
    return f"{what} ends with an unfinished escape (a lone backslash); write \\\\ for a literal backslash"


def _pattern_escape_error(node: dict, path: str) -> str:
    """`dangling_escape_error` of the schema ``node``'s ``pattern`` or one of its ``patternProperties``."""
    where = f" at {path}" if path else ""
    if isinstance(node.get("pattern"), str):
        error = dangling_escape_error(node["pattern"], f"pattern{where}")
        if error:
            return error
    extra = node.get("patternProperties")
    for key in extra if isinstance(extra, dict) else ():
        error = dangling_escape_error(key, f"patternProperties key{where}")
        if error:
            return error
    return ""


def _integers_in(value: Any) -> Iterator[int]:
    """The integers in a JSON value (booleans aside)."""
    if isinstance(value, int) and not isinstance(value, bool):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _integers_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _integers_in(item)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short_bound(value: int | float) -> str:
    return (str(value) if len(str(value)) <= 24 else _short_number(value)) if isinstance(value, int) else repr(value)


def _float_scaled(value: int | float) -> float:
    """``value`` times ten until it is an integer, in 64-bit floating point (llguidance's reading)."""
    try:
        scaled = float(value)
    except OverflowError:
        return math.inf
    while math.isfinite(scaled) and scaled != math.floor(scaled):
        scaled *= 10
    return scaled


def _pointer_token(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _scaled_multiple(value: Any) -> int:
    """A ``multipleOf`` value as the integer llguidance's number automaton counts by (0.25 -> 25,
    1.5e3 -> 1500); 1 for anything else (not a positive finite number: the compile reports it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return 1
    if isinstance(value, float) and not math.isfinite(value):
        return 1
    _, digits, exponent = decimal.Decimal(value if isinstance(value, int) else repr(value)).normalize().as_tuple()
    mantissa = int("".join(map(str, digits)))
    return mantissa * 10 ** exponent if exponent > 0 else mantissa


def _short_number(value: int) -> str:
    text = str(value)
    return text if len(text) <= 12 else f"about 1e{len(text) - 1}"


class _RefDepth:
    """How many levels a schema's subschemas nest, a ``$ref`` counting as its target in its place; a
    ref back into its own path (recursion) counts as one level. Memoized per node; None past
    `MAX_REF_DEPTH`."""

    def __init__(self, document: SchemaDocument):
        self._document = document
        self._depths: dict[int, int] = {}
        self._path: set[int] = set()

    def depth(self, node: Any, level: int = 1) -> int | None:
        if not isinstance(node, dict) or id(node) in self._path:
            return 1
        if id(node) in self._depths:
            deepest = self._depths[id(node)]
            return None if level + deepest - 1 > MAX_REF_DEPTH else deepest
        if level > MAX_REF_DEPTH:
            return None
        self._path.add(id(node))
        try:
            deepest = 1
            target = self._target(node)
            if target is not None:
                deepest = self.depth(target, level)
                if deepest is None:
                    return None
            for child in self._children(node):
                below = self.depth(child, level + 1)
                if below is None:
                    return None
                deepest = max(deepest, below + 1)
        finally:
            self._path.discard(id(node))
        self._depths[id(node)] = deepest
        return deepest

    def _target(self, node: dict) -> Any:
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return None
        try:
            return self._document.resolve(ref)
        except RequestError:
            return None  # the compile reports a bad $ref

    @staticmethod
    def _children(node: dict) -> Iterator[Any]:
        for key, value in node.items():
            if key in SUBSCHEMA_MAPS and key not in ("$defs", "definitions") and isinstance(value, dict):
                yield from value.values()
            elif key in SUBSCHEMA_KEYS:
                yield from (value if isinstance(value, list) else [value])


class _RefAlternatives:
    """How many alternatives of a node's ``anyOf``/``oneOf`` hold a ``$ref`` somewhere inside them
    (not through it); a branch that is itself an anyOf/oneOf adds its own count instead, as
    llguidance flattens nested alternatives into one (it keeps refs as rules of their own)."""

    def __init__(self):
        self._counts: dict[int, int] = {}
        self._refs: dict[int, bool] = {}

    def count(self, node: dict) -> int:
        if id(node) not in self._counts:
            total = 0
            for key in ("anyOf", "oneOf"):
                branches = node.get(key)
                for branch in branches if isinstance(branches, list) else ():
                    if not isinstance(branch, dict):
                        continue
                    if isinstance(branch.get("anyOf"), list) or isinstance(branch.get("oneOf"), list):
                        total += self.count(branch)
                    else:
                        total += self.holds_ref(branch)
            self._counts[id(node)] = total
        return self._counts[id(node)]

    def holds_ref(self, node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if id(node) not in self._refs:
            found = isinstance(node.get("$ref"), str)
            for key, value in node.items():
                if found:
                    break
                if key in SUBSCHEMA_MAPS and isinstance(value, dict):
                    found = any(self.holds_ref(child) for child in value.values())
                elif key in SUBSCHEMA_KEYS:
                    found = any(self.holds_ref(child) for child in (value if isinstance(value, list) else [value]))
            self._refs[id(node)] = found
        return self._refs[id(node)]


class _JointPatterns:
    """How many ``pattern``s a value of a schema node may have to match at once: its own, plus those
    of its ``$ref`` target and of every ``allOf`` branch, plus the most of any one ``anyOf``/``oneOf``
    branch (llguidance distributes allOf over them). Memoized per node; a node met again on its own
    path (a cycle through allOf or refs) adds nothing; None past `_MAX_JOINT_DEPTH` nested nodes."""

    def __init__(self, document: SchemaDocument):
        self._document = document
        self._counts: dict[int, int | None] = {}
        self._path: set[int] = set()

    def count(self, node: Any, depth: int = 0) -> int | None:
        if not isinstance(node, dict) or id(node) in self._path:
            return 0
        if id(node) in self._counts:
            return self._counts[id(node)]
        if depth > _MAX_JOINT_DEPTH:
            return None
        self._path.add(id(node))
        try:
            parts = [1 if isinstance(node.get("pattern"), str) else 0]
            ref = node.get("$ref")
            if isinstance(ref, str):
                parts.append(self.count(self._document.resolve(ref), depth + 1))
            branches = node.get("allOf")
            for branch in branches if isinstance(branches, list) else ():
                parts.append(self.count(branch, depth + 1))
            for key in ("anyOf", "oneOf"):
                branches = node.get(key)
                if isinstance(branches, list):
                    counts = [self.count(branch, depth + 1) for branch in branches]
                    parts.append(None if None in counts else max(counts, default=0))
        finally:
            self._path.discard(id(node))
        total = None if None in parts else sum(parts)
        self._counts[id(node)] = total
        return total


_MAX_JOINT_DEPTH = 200  # refs and allOf/anyOf nested this deep are past any real schema (and Python's stack)

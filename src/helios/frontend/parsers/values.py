"""The request's tools as parsers see them, and typing of parameter values from their schemas.

`ToolRegistry` is built once per request from the OpenAI ``tools`` list. For each parameter it
keeps the JSON types the schema allows (``type`` as a string or a list, ``enum``/``const`` values,
``anyOf``/``oneOf`` branches, OpenAPI's ``nullable``, narrowed by local ``$ref`` targets and ``allOf``
branches, see `schema_kinds`). Each tool's schema is checked as a `SchemaDocument` first: a remote or
unresolvable ``$ref`` raises `SchemaRefError` (HTTP 400). `typed_value` turns a parameter's raw text
into JSON text:

- a parameter allowing only ``string`` (or one with no usable type: undeclared, untyped) is the raw
  text, verbatim;
- otherwise the other allowed types are tried on the text without surrounding whitespace, in this
  order: integer, number, boolean, null, object/array (as JSON, else as a Python literal of JSON
  values, ``{'a': True, 'b': None}``, which models trained on Python write and vLLM's Qwen3-Coder
  and GLM parsers read with ``ast.literal_eval``: `python_literal`), an integer spelled as a whole
  number (``3.0``, ``1e3``); then ``string`` if allowed;
- if nothing fits, the raw text is kept as a JSON string and the result says it was invalid.
"""

from __future__ import annotations

import ast
import decimal
import enum
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

from helios.frontend.parsers.schema_refs import SchemaDocument


class ValueKind(enum.Enum):
    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    NULL = "null"
    OBJECT = "object"
    ARRAY = "array"


_TRY_ORDER = (ValueKind.INTEGER, ValueKind.NUMBER, ValueKind.BOOLEAN, ValueKind.NULL, ValueKind.OBJECT, ValueKind.ARRAY)
STRING_ONLY = frozenset({ValueKind.STRING})
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)\Z")


@dataclass(frozen=True)
class ToolSpec:
    """One registered function: its name and the JSON schema kinds of its parameters."""

    name: str
    parameters: Mapping[str, frozenset[ValueKind]]

    @classmethod
    def from_schema(cls, name: str, schema: Mapping[str, Any] | None, index: int | None = None) -> "ToolSpec":
        """SchemaRefError when the schema's refs are not local or do not resolve (its param names
        the tool's ``parameters`` by its `index` in the request's ``tools``, where given)."""
        document = tool_document(name, schema, index)
        properties = tool_properties(document)
        return cls(name, {str(key): schema_kinds(value, document) for key, value in properties.items()})


def tool_param(index: int | None) -> str:
    """The request field holding the ``parameters`` of the tool at `index` of ``tools`` (as
    pydantic's errors spell it); ``tools`` when the index is not known."""
    return "tools" if index is None else f"tools[{index}].function.parameters"


def tool_document(name: str, schema: Any, index: int | None = None) -> SchemaDocument:
    """A tool's ``parameters`` as a checked schema document (an absent schema is ``{}``); its errors
    name the field by the tool's `index` in the request's ``tools`` (`tool_param`)."""
    return SchemaDocument(schema if isinstance(schema, Mapping) else {}, f"tool {name!r} parameters", tool_param(index))


def tool_properties(document: SchemaDocument) -> Mapping[str, Any]:
    """The ``properties`` of a tool's parameters, through a ``$ref`` at the top (pydantic writes
    one for a recursive model); empty when there are none."""
    root = document.deref(document.root)
    properties = root.get("properties") if isinstance(root, Mapping) else None
    return properties if isinstance(properties, Mapping) else {}


class ToolRegistry:
    """The request's registered tools by name. Immutable after construction; shared read-only."""

    def __init__(self, tools: Sequence[ToolSpec] = ()):
        self._tools = {tool.name: tool for tool in tools}

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]] | None) -> "ToolRegistry":
        """From the request's ``tools`` list (``{"type": "function", "function": {...}}`` items)."""
        specs = []
        for index, tool in enumerate(tools or ()):
            function = tool.get("function") or {}
            if tool.get("type", "function") == "function" and function.get("name"):
                specs.append(ToolSpec.from_schema(function["name"], function.get("parameters"), index))
        return cls(specs)

    def has(self, name: str) -> bool:
        return name in self._tools

    def kinds(self, tool: str, parameter: str) -> frozenset[ValueKind]:
        """Allowed kinds of a parameter; string-only when the tool or parameter is not declared."""
        spec = self._tools.get(tool)
        kinds = spec.parameters.get(parameter) if spec is not None else None
        return kinds or STRING_ONLY


def schema_kinds(schema: Any, document: SchemaDocument | None = None) -> frozenset[ValueKind]:
    """JSON types a (sub)schema allows; empty when it declares none.

    ``type``, ``enum``/``const``, ``anyOf``/``oneOf`` branches and ``nullable: true`` (beside other
    kinds) add kinds. With the ``document`` the schema belongs to, its ``$ref`` target and ``allOf``
    branches narrow them (an intersection when both sides declare kinds); a ref already being followed
    adds nothing (the least fixed point of a recursion such as ``A = anyOf[A, null]``). Each ref is
    followed once per call.
    """
    return _kinds(schema, document, frozenset(), {})


def _kinds(schema: Any, document: SchemaDocument | None, visiting: frozenset[str],
           memo: dict[str, frozenset[ValueKind]]) -> frozenset[ValueKind]:
    if not isinstance(schema, Mapping):
        return frozenset()
    kinds: set[ValueKind] = set()
    declared = schema.get("type")
    for name in declared if isinstance(declared, list) else [declared]:
        if isinstance(name, str) and name in ValueKind._value2member_map_:
            kinds.add(ValueKind(name))
    for literal in [*_branches(schema, "enum"), *([schema["const"]] if "const" in schema else [])]:
        kinds.add(_kind_of(literal))
    for key in ("anyOf", "oneOf"):
        for branch in _branches(schema, key):
            kinds |= _kinds(branch, document, visiting, memo)
    narrowed = frozenset(kinds)
    for branch in _branches(schema, "allOf"):
        narrowed = _both(narrowed, _kinds(branch, document, visiting, memo))
    ref = schema.get("$ref")
    if document is not None and isinstance(ref, str) and ref not in visiting:
        if ref not in memo:
            memo[ref] = _kinds(document.resolve(ref), document, visiting | {ref}, memo)
        narrowed = _both(narrowed, memo[ref])
    if narrowed and schema.get("nullable") is True:
        # OpenAPI's spelling of Optional, which transformers' `get_json_schema` writes for
        # `Optional[int]`: null beside the declared kinds (a model writes it `None` or `null`)
        narrowed |= {ValueKind.NULL}
    return narrowed


def _branches(schema: Mapping, key: str) -> list:
    """The list under ``key``; empty when it is not a list (a malformed ``enum: 5`` or ``anyOf: {}``
    constrains nothing here: typing model text never fails a request for its schema)."""
    branches = schema.get(key)
    return branches if isinstance(branches, list) else []


def _both(left: frozenset[ValueKind], right: frozenset[ValueKind]) -> frozenset[ValueKind]:
    """Kinds both constraints allow (an empty side constrains nothing)."""
    if not left or not right:
        return left or right
    return _with_integers(left) & _with_integers(right)


def _with_integers(kinds: frozenset[ValueKind]) -> frozenset[ValueKind]:
    """Every integer is a number (adding INTEGER beside NUMBER types no text differently)."""
    return kinds | {ValueKind.INTEGER} if ValueKind.NUMBER in kinds else kinds


def _kind_of(value: Any) -> ValueKind:
    if isinstance(value, bool):
        return ValueKind.BOOLEAN
    if isinstance(value, int):
        return ValueKind.INTEGER
    if isinstance(value, float):
        return ValueKind.NUMBER
    if value is None:
        return ValueKind.NULL
    if isinstance(value, Mapping):
        return ValueKind.OBJECT
    if isinstance(value, list):
        return ValueKind.ARRAY
    return ValueKind.STRING


class TypedValue(NamedTuple):
    json_text: str
    valid: bool


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)  # 1e999: JSON has no spelling for infinity
    return value


# Strict JSON: no NaN/Infinity constants and no number beyond the float range (1e999), which JSON
# cannot spell; `json.dumps` would write them as `NaN`/`Infinity`, text no client's JSON parser reads.
# Decoding (and dumping) deep nesting raises RecursionError, which callers treat as not JSON.
STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def parse_json(text: str) -> Any:
    """The value of a strict JSON text (`STRICT_JSON`); ValueError or RecursionError otherwise."""
    return STRICT_JSON.decode(text)


def _try_kind(kind: ValueKind, text: str) -> tuple[bool, Any]:
    try:
        if kind is ValueKind.INTEGER:
            return (True, int(text)) if _INTEGER.match(text) else (False, None)
        if kind is ValueKind.NUMBER:
            value = parse_json(text)
            return isinstance(value, (int, float)) and not isinstance(value, bool), value
        if kind is ValueKind.BOOLEAN:
            lowered = text.lower()
            return (lowered in ("true", "false"), lowered == "true")
        if kind is ValueKind.NULL:
            return (text in ("null", "None"), None)
        container = dict if kind is ValueKind.OBJECT else list
        try:
            value = parse_json(text)
        except (ValueError, RecursionError):
            value = python_literal(text)
        return isinstance(value, container), value
    except (ValueError, RecursionError):
        return False, None


MAX_PYTHON_LITERAL_LEN = 64 * 1024  # characters: a larger value is not read as a Python literal
# Tokens (`_num_tokens`): `ast.literal_eval` builds and walks one Python object per token or so, holding
# the GIL (about 3 us each: 64 KiB of "[1,1,...]" took 0.2 s, stalling every other request).
MAX_PYTHON_LITERAL_TOKENS = 4096
# One lexeme of Python's tokenizer, or a token's worth more: a string, its prefix in group 1 (an
# f-string's holds "f"), group 2 a quote that opens no terminated string (Python's tokenizer stops
# there, and so does the count: a scan for a closer is then made once, which keeps it linear), a
# comment, a decimal number, a run of word characters (a name, or a number and a name run together:
# ``1or``, two tokens, is two lexemes here) or one other character.
_PY_STRINGS = ([rf"{q * 3}(?:[^\\]|\\.)*?{q * 3}" for q in "'\""]
               + [rf"{q}(?!{q * 2})(?:[^{q}\\\n]|\\.)*{q}" for q in "'\""])
_PY_DIGITS = r"\d(?:_?\d)*"
_PY_NUMBER = rf"{_PY_DIGITS}(?:\.(?:{_PY_DIGITS})?)?(?:[eE][+-]?{_PY_DIGITS})?[jJ]?"
_PY_LEXEME = re.compile(rf"((?i:br|rb|fr|rf|[rbuf]))?(?:{'|'.join(_PY_STRINGS)}|(['\"]))|#[^\n]*|{_PY_NUMBER}"
                        r"|\w+|[^\w\s]", re.DOTALL)


def _num_tokens(text: str, limit: int) -> int:
    """At least the number of Python tokens in ``text`` (`_PY_LEXEME`), counted up to ``limit + 1``;
    ValueError for an f-string (no literal holds one; Python 3.12 tokenizes its replacement fields)."""
    count = 0
    for lexeme in _PY_LEXEME.finditer(text):
        if "f" in (lexeme.group(1) or "").lower():
            raise ValueError("an f-string is no Python literal")
        count += 1
        if lexeme.group(2) or count > limit:
            break
    return count


def python_literal(text: str) -> Any:
    """The JSON value of a Python literal object or array (``{'a': True, 'b': None}``, ``[1, (2,)]``):
    dicts with string keys, lists and tuples (as arrays), strings, booleans, None, integers and finite
    floats. ValueError for anything else: not such a literal, other Python values (sets, bytes,
    complex numbers, non-string keys), or text beyond `MAX_PYTHON_LITERAL_LEN` characters or
    `MAX_PYTHON_LITERAL_TOKENS` tokens. `ast.literal_eval` evaluates no code; the bounds keep its
    parse cheap, and nesting beyond the parser's limit is a SyntaxError (or RecursionError)."""
    if len(text) > MAX_PYTHON_LITERAL_LEN or not text.startswith(("{", "[")):
        raise ValueError("not a Python literal object or array")
    if _num_tokens(text, MAX_PYTHON_LITERAL_TOKENS) > MAX_PYTHON_LITERAL_TOKENS:
        raise ValueError(f"a Python literal of more than {MAX_PYTHON_LITERAL_TOKENS} tokens is not read")
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, TypeError, MemoryError) as error:  # ValueError and RecursionError propagate
        raise ValueError("not a Python literal") from error
    return _json_of_literal(value)


def _json_of_literal(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON has no spelling for infinity")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_of_literal(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_of_literal(item) for key, item in value.items()}
    raise ValueError(f"a Python {type(value).__name__} is no JSON value")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dump_json(value: Any) -> str:
    """JSON text with non-ASCII characters unescaped, except lone surrogates (a model's JSON may
    escape one, ``"\\ud800"``): they stay escaped, since text holding one cannot be sent as UTF-8.
    RecursionError on nesting too deep to write."""
    text = json.dumps(value, ensure_ascii=False)
    if text.isascii() or not _LONE_SURROGATE.search(text):
        return text
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def typed_value(raw: str, kinds: frozenset[ValueKind]) -> TypedValue:
    """JSON text for ``raw`` under ``kinds`` (see the module docstring)."""
    if not kinds or kinds == STRING_ONLY:
        return TypedValue(dump_json(raw), True)
    text = raw.strip()
    for kind in _TRY_ORDER:
        if kind in kinds:
            ok, value = _try_kind(kind, text)
            if ok:
                return TypedValue(dump_json(value), True)
    if ValueKind.INTEGER in kinds and _try_kind(ValueKind.NUMBER, text)[0]:
        # JSON Schema's integers are the numbers with a zero fractional part: "3.0" is 3 (as
        # transformers' response parser reads it), which no other allowed kind took above. The text
        # is a JSON number in float range (so its integer is bounded), read exactly, not through a
        # float: one would round "9007199254740993.0" and still call it valid.
        exact = decimal.Decimal(text)
        if exact.is_finite() and exact == exact.to_integral_value():
            return TypedValue(dump_json(int(exact)), True)
    return TypedValue(dump_json(raw), ValueKind.STRING in kinds)


def json_value(raw: str) -> TypedValue:
    """JSON text for a value declared to be JSON (any type); the raw string when it is not JSON."""
    try:
        return TypedValue(dump_json(parse_json(raw.strip())), True)
    except (ValueError, RecursionError):
        return TypedValue(dump_json(raw), False)

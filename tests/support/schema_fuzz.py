"""Seeded random JSON schemas from the subset Helios serves, instances that satisfy them, and the
reference validator the structured-output fuzz checks against (`jsonschema`, Draft 2020-12).

`random_schema(rng)` writes a root schema from: the JSON types, nested objects with required and
optional properties and ``additionalProperties`` true/false/a schema, arrays (``items``,
``prefixItems``, ``minItems``/``maxItems``), ``enum``/``const`` (unicode, escapes, ``1`` beside
``1.0``, ``null``, arrays and objects), ``anyOf``, ``allOf``, local ``$ref``s into ``$defs``
(recursion included), string ``minLength``/``maxLength``/``pattern``/``format``, numeric
``minimum``/``maximum``/``exclusive*``/``multipleOf`` and nullable type lists. Its patterns are
ECMA-262 regexes that Python's ``re`` reads the same way (no ``\\w``/``\\d``, whose Unicode meaning
differs), and ``multipleOf`` values are binary fractions, so the reference never disagrees with
JSON Schema itself over float rounding.

`random_instance(rng, schema)` writes a value the schema accepts (checked by `validate`), objects
with their declared properties first in declared order, as llguidance writes them.

`UNSUPPORTED` are keywords llguidance does not implement: a ``response_format`` schema holding one
is refused with a 400 that names it; tool parameters ignore them (README: "keywords llguidance does
not implement are ignored").
"""

from __future__ import annotations

import datetime
import json
import math
import random
import re
from typing import Any

import jsonschema

# ECMA-262 patterns Python's `re` reads alike, each with values that match it.
PATTERNS = {
    "^[a-z]{1,4}$": ["ab", "z", "qrst"],
    "^[0-9]{3}-[0-9]{2}$": ["123-45", "000-99"],
    "^(yes|no|maybe)$": ["yes", "maybe"],
    "^é+ü?$": ["é", "ééü"],
    "ab": ["ab", "xaby"],  # unanchored: JSON Schema searches
    "^[A-Z]": ["Q", "Qrs"],
    "[0-9]$": ["x1", "9"],
    "^[^\"\\\\]{0,3}$": ["", "a b", "ü."],
}
FORMATS = {
    "date": ["2024-02-29", "1999-12-31"],
    "time": ["10:00:00Z", "23:59:59+01:00"],
    "date-time": ["2020-01-01T00:00:00Z", "2024-02-29T12:30:45.5+05:30"],
    "email": ["a@b.co", "x.y@example.org"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000"],
    "ipv4": ["1.2.3.4", "255.0.0.1"],
}
# Scalars for enum/const: unicode, escapes, a control character, 1 beside 1.0 and -0.
LITERALS = ["a", "é", "line\nbreak", 'quote"', "back\\slash", "tab\t", "😀", "\u0001", "</x>", "", " ",
            1, 1.0, 2.5, -3, 0, -0.0, 1e3, None, True, False, [1, "a"], {"k": [None]}, {}]
NAMES = ["a", "b", "name", "é", "key with space", 'q"t', "x-y", "back\\", "n1", "😀", "$ref", "type"]
SCALAR_TYPES = ("string", "integer", "number", "boolean", "null")
UNSUPPORTED = ("not", "uniqueItems", "contains", "if", "propertyNames", "dependentRequired",
               "unevaluatedProperties")


def format_checker() -> jsonschema.FormatChecker:
    """Draft 2020-12's format checker, plus ``date-time`` and ``time`` (RFC 3339), which
    `jsonschema` checks only with an optional package this environment lacks."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    checker = jsonschema.FormatChecker(list(checker.checkers))

    @checker.checks("date-time", raises=ValueError)
    def _date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        date, _, time = re.split("([Tt])", value, maxsplit=1) if re.search("[Tt]", value) else (value, "", "")
        return bool(time) and _is_date(date) and _is_time(time)

    @checker.checks("time", raises=ValueError)
    def _time(value: object) -> bool:
        return not isinstance(value, str) or _is_time(value)

    return checker


def _is_date(text: str) -> bool:
    if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text) is None:
        return False
    datetime.date.fromisoformat(text)  # ValueError: no such day
    return True


def _is_time(text: str) -> bool:
    found = re.fullmatch(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|[+-]([0-9]{2}):([0-9]{2}))", text)
    if found is None:
        return False
    hour, minute, second = (int(found.group(i)) for i in (1, 2, 3))
    offset = found.group(6)
    return hour < 24 and minute < 60 and second < 61 and (offset is None or (int(offset) < 24 and int(found.group(7)) < 60))


FORMAT_CHECKER = format_checker()


def validate(instance: Any, schema: dict) -> list[str]:
    """The reference's violations of ``instance`` against ``schema`` (Draft 2020-12, formats asserted)."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(instance)]


class SchemaWriter:
    """Writes one random root schema; ``defs`` collects its ``$defs``."""

    def __init__(self, rng: random.Random, max_depth: int = 3):
        self.rng = rng
        self.max_depth = max_depth
        self.defs: dict[str, Any] = {}

    def root(self) -> dict:
        rng = self.rng
        if rng.random() < 0.2:  # a recursive definition at the top (a linked list or tree)
            self.defs["node"] = {"type": "object", "properties": {
                "v": self.scalar(rng.choice(("integer", "string", "boolean"))),
                "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v"],
                "additionalProperties": rng.random() < 0.5}
            schema: dict = {"$ref": "#/$defs/node"}
        else:
            schema = self.object(0) if rng.random() < 0.7 else self.any(0)
        if self.defs:
            schema["$defs"] = self.defs
        return schema

    def any(self, depth: int) -> dict:
        rng = self.rng
        choices = ["scalar"] * 4 + ["enum", "const", "nullable"]
        if depth < self.max_depth:
            choices += ["object", "object", "array", "array", "anyOf", "ref", "allOf"]
        kind = rng.choice(choices)
        if kind == "scalar":
            return self.scalar(rng.choice(SCALAR_TYPES))
        if kind == "enum":
            return {"enum": rng.sample(LITERALS, rng.randint(1, 4))}
        if kind == "const":
            return {"const": rng.choice(LITERALS)}
        if kind == "nullable":
            schema = self.scalar(rng.choice(("string", "integer", "number", "boolean")))
            schema["type"] = [schema["type"], "null"]
            return schema
        if kind == "object":
            return self.object(depth + 1)
        if kind == "array":
            return self.array(depth + 1)
        if kind == "anyOf":
            return {"anyOf": [self.any(depth + 1) for _ in range(rng.randint(2, 3))]}
        if kind == "allOf":  # a type and its bounds split over two branches
            scalar = self.scalar(rng.choice(("string", "integer", "number")))
            kind_only = {"type": scalar.pop("type")}
            return {"allOf": [kind_only, scalar]}
        name = f"d{len(self.defs)}"
        self.defs[name] = {}  # reserved: the definition may add others
        self.defs[name] = self.any(depth + 1)
        return {"$ref": f"#/$defs/{name}"}

    def scalar(self, kind: str) -> dict:
        rng = self.rng
        schema: dict = {"type": kind}
        if kind == "string":
            pick = rng.random()
            if pick < 0.3:
                low = rng.randint(0, 3)
                schema.update(minLength=low, maxLength=low + rng.randint(0, 6))
            elif pick < 0.5:
                schema["maxLength"] = rng.randint(0, 8)
            elif pick < 0.7:
                schema["pattern"] = rng.choice(list(PATTERNS))
            elif pick < 0.85:
                schema["format"] = rng.choice(list(FORMATS))
        elif kind in ("integer", "number"):
            fraction = kind == "number" and rng.random() < 0.5
            low = rng.randint(-50, 50) + (rng.choice((0.25, 0.5, 0.75)) if fraction else 0)
            high = low + rng.randint(0, 100) + (0.5 if fraction else 0)
            if rng.random() < 0.5:
                schema["exclusiveMinimum" if rng.random() < 0.3 else "minimum"] = low
            if rng.random() < 0.5:
                if "exclusiveMinimum" in schema or rng.random() < 0.3:
                    high = max(high, low + 2)
                    schema["exclusiveMaximum"] = high
                else:
                    schema["maximum"] = high
            if rng.random() < 0.3:
                schema["multipleOf"] = rng.choice((2, 3, 5) if kind == "integer" else (0.5, 0.25, 2))
                if "maximum" in schema or "exclusiveMaximum" in schema:
                    schema.pop("minimum", None), schema.pop("exclusiveMinimum", None)  # keep a multiple in range
                    schema.pop("maximum", None), schema.pop("exclusiveMaximum", None)
        return schema

    def object(self, depth: int) -> dict:
        rng = self.rng
        names = rng.sample(NAMES, rng.randint(0, 4))
        properties = {name: self.any(depth) for name in names}
        schema: dict = {"type": "object", "properties": properties}
        required = [name for name in names if rng.random() < 0.5]
        if required:
            schema["required"] = required
        extra = rng.random()
        if extra < 0.4:
            schema["additionalProperties"] = False
        elif extra < 0.55:
            schema["additionalProperties"] = self.scalar(rng.choice(SCALAR_TYPES))
        elif extra < 0.65:
            schema["additionalProperties"] = True
        return schema

    def array(self, depth: int) -> dict:
        rng = self.rng
        schema: dict = {"type": "array", "items": self.any(depth)}
        if rng.random() < 0.2:
            schema["prefixItems"] = [self.any(depth) for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.5:
            low = rng.randint(0, 2)
            schema["minItems"] = low
            if rng.random() < 0.7:
                schema["maxItems"] = low + rng.randint(0, 3)
        elif rng.random() < 0.5:
            schema["maxItems"] = rng.randint(0, 3)
        return schema


def random_schema(rng: random.Random, max_depth: int = 3) -> dict:
    return SchemaWriter(rng, max_depth).root()


def with_unsupported(rng: random.Random, schema: dict) -> tuple[dict, str]:
    """``schema`` with one keyword llguidance does not implement added at the top, and that keyword."""
    keyword = rng.choice(UNSUPPORTED)
    value = {
        "not": {"type": "null"}, "uniqueItems": True, "contains": {"type": "integer"}, "if": {"type": "object"},
        "propertyNames": {"maxLength": 5}, "dependentRequired": {"a": ["b"]}, "unevaluatedProperties": False,
    }[keyword]
    return {**schema, keyword: value}, keyword


# --- instances ------------------------------------------------------------------------------------


class NoInstance(Exception):
    """The writer found no value for a (sub)schema within its depth (the caller tries again)."""


def random_instance(rng: random.Random, schema: dict, max_depth: int = 6) -> Any:
    """A value ``schema`` accepts (NoInstance when the walk found none)."""
    return _Instances(rng, schema, max_depth).value(schema, 0)


class _Instances:
    def __init__(self, rng: random.Random, root: dict, max_depth: int):
        self.rng, self.root, self.max_depth = rng, root, max_depth

    def value(self, schema: Any, depth: int) -> Any:
        rng = self.rng
        if schema is True or schema == {}:
            return rng.choice([1, "x", None, [], {"k": True}])
        if depth > self.max_depth:
            raise NoInstance
        if "$ref" in schema:
            name = schema["$ref"].removeprefix("#/$defs/")
            return self.value(self.root["$defs"][name], depth + 1)
        if "enum" in schema:
            return rng.choice(schema["enum"])
        if "const" in schema:
            return schema["const"]
        if "anyOf" in schema:
            branches = list(schema["anyOf"])
            rng.shuffle(branches)
            for branch in branches:
                try:
                    return self.value(branch, depth + 1)
                except NoInstance:
                    continue
            raise NoInstance
        if "allOf" in schema:
            merged = {key: value for branch in schema["allOf"] for key, value in branch.items()}
            return self.value(merged, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice(kind)
            if kind == "null":
                return None
        return getattr(self, f"_{kind}")(schema, depth)

    def _null(self, schema: dict, depth: int) -> None:
        return None

    def _boolean(self, schema: dict, depth: int) -> bool:
        return self.rng.random() < 0.5

    def _string(self, schema: dict, depth: int) -> str:
        rng = self.rng
        if "pattern" in schema:
            return rng.choice(PATTERNS[schema["pattern"]])
        if "format" in schema:
            return rng.choice(FORMATS[schema["format"]])
        low, high = schema.get("minLength", 0), schema.get("maxLength", 6)
        alphabet = "az é😀\"\\\n\t/<>{}"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, max(low, high))))

    def _integer(self, schema: dict, depth: int) -> int:
        return int(self._number(schema, depth, integer=True))

    def _number(self, schema: dict, depth: int, integer: bool = False) -> float | int:
        rng = self.rng
        step = schema.get("multipleOf", 1 if integer else 0.25)
        low = max(schema.get("minimum", -100), schema.get("exclusiveMinimum", -101) + 1e-9)
        high = min(schema.get("maximum", 100), schema.get("exclusiveMaximum", 101) - 1e-9)
        first, last = -(-low // step), high // step
        if first > last:
            raise NoInstance
        value = rng.randint(int(first), int(last)) * step
        return int(value) if integer or value == int(value) and rng.random() < 0.5 else float(value)

    def _array(self, schema: dict, depth: int) -> list:
        rng = self.rng
        prefix = schema.get("prefixItems", [])
        low, high = schema.get("minItems", 0), schema.get("maxItems", 3)
        count = rng.randint(low, max(low, high))
        return [self.value(prefix[i] if i < len(prefix) else schema.get("items", True), depth + 1)
                for i in range(count)]

    def _object(self, schema: dict, depth: int) -> dict:
        rng = self.rng
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        out = {}
        for name, sub in properties.items():
            if name in required or rng.random() < 0.5:
                out[name] = self.value(sub, depth + 1)
        extra = schema.get("additionalProperties", True)
        if extra is not False and rng.random() < 0.3:
            key = rng.choice(["zz", "ü", "k k"])
            if key not in properties:
                out[key] = self.value(extra, depth + 1)
        return out


def compact(value: Any, decimals: int = 0) -> str:
    """``value`` as compact JSON the way llguidance writes it: no whitespace, raw (unescaped)
    non-ASCII characters, integral numbers without a fraction (``1.0`` is ``1``, equal in JSON
    Schema; ``-0.0`` is ``-0``), and fractions padded to ``decimals`` digits (llguidance writes a number under a
    fractional ``multipleOf`` with as many decimals as the ``multipleOf`` has: ``0.50`` for 0.25)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{compact(key)}:{compact(item, decimals)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(compact(item, decimals) for item in value) + "]"
    if isinstance(value, float):
        if value == int(value):  # -0.0 as llguidance spells it: -0
            return "-0" if value == 0 and math.copysign(1, value) < 0 else str(int(value))
        text = repr(value)
        fraction = text.split(".")[1] if "." in text and "e" not in text else None
        if fraction is not None and len(fraction) < decimals:
            text += "0" * (decimals - len(fraction))
        return text
    return json.dumps(value, ensure_ascii=False)

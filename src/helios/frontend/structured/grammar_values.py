"""Grammars for tool-call parameter values, typed the way the output parsers read them.

A parameter's JSON schema decides its value grammar through the parsers' own typing
(`helios.frontend.parsers.values.schema_kinds`), so every generated value parses back to JSON that
the schema accepts:

- a parameter the parsers read as a plain string (only ``string`` allowed, or no usable type) is raw
  text up to the value closer, or one of its string ``enum``/``const`` values; its ``minLength``,
  ``maxLength`` and ``pattern`` (unanchored unless it spells ``^``/``$``, as in JSON) hold for the
  text the parser reads (`StringBounds`), with the syntax's value wrap written around it, wherever
  the schema gives them: behind a ``$ref``, in ``allOf`` or ``anyOf``/``oneOf`` branches
  (`grammar_strings.raw_string`; differently bounded alternatives are a 400). Such a value
  never holds the closer's text: a forced value ends at its first closer, as the parser reads it
  (a value the model writes unforced is what the parser reads: `tag_tools`, a closer before other
  text is value text). Nor does it spell a tag that ends a value whose closer was left out
  (`ValueStyle.cuts`: Qwen Coder's parser, as vLLM's, ends a value at a newline and a parameter tag
  or the function closer), so a forced value is never cut short. XML-escaped, its lengths count
  decoded characters and its pattern holds for the decoded text (`grammar_escaped`; a pattern that
  cannot be carried over holds for text without entities, which reads as written). Limits,
  each a 400 naming the tool and parameter rather than a bound silently dropped: ``^``/``$`` only at
  the ends of the pattern or of its top-level alternatives, and minLength/maxLength at most
  ``MAX_COUNTED_LEN`` when the value also has a pattern or a minLength (a maxLength alone has no
  limit). ``format`` is not enforced on raw text (llguidance implements formats only inside JSON);
- a nullable plain string (the parsers try ``null``, then take the text: ``type: [string, null]``,
  pydantic's ``Optional[str]``) is that raw text (its string alternatives' bounds, null-only
  ``anyOf``/``oneOf`` branches aside) or ``null``; raw text reading ``null`` is null, which the
  schema allows;
- any other parameter is a JSON document under its schema (llguidance ``%json``), with string
  branches removed when the parsers would read the text as a raw string instead; scalars are then
  spelled as the parsers expect them (``3``, ``true``, ``null``). Its string ``enum``/``const``
  values are raw text beside it where the parsers read them back as strings
  (`mixed_string_literals`: ``anyOf: [{type: integer}, {const: "auto"}]`` writes ``auto``), and so
  is any text the parsers read back as a string where the schema allows any string (`mixed_free_string`:
  ``type: [integer, string]``, ``anyOf: [{type: integer}, {type: string}]``): text that does not read
  as one of the other kinds (for integers or numbers no JSON number at all, so ``3.5`` beside integers
  stays unwritten though the parser would read it as a string). Strings a mixed parameter bounds
  (``maxLength``, ``pattern``, ``format`` ...) stay unwritten, and so does the free string beside a
  literal the free text leaves out (``const: "3.5"`` beside integers: the literal is written);
- a syntax whose markup declares JSON (`ValueStyle.flag`: DSML ``string="false"``) writes JSON
  under the whole schema, and raw text under ``string="true"`` for plain string parameters;
- XML-escaped syntaxes (XTML) write raw strings as escaped text, held to what it decodes to.

JSON strings must not end the value early: their decoded text never contains the value closer (raw
syntaxes) and holds ``&``, ``<`` and ``>`` only as the entities the parser decodes (escaped
syntaxes, where ``&quot;`` is excluded since it would decode to a JSON quote); a string's own
``pattern`` or ``format`` is intersected with that rule (``allOf``), not replaced by it, and string
``enum``/``const`` values that break it are left out. In escaped syntaxes llguidance checks the text
as written while the parser decodes it: ``enum``/``const`` values and property names are escaped and
patterns carried to the escaped language (`grammar_escaped`), and a string with a ``minLength``,
``maxLength``, ``format`` or a pattern that cannot be carried over holds no ``&``, ``<`` or ``>`` at
all (llguidance counts and matches the characters as written). Numbers without
declared bounds stay within ``NUMBER_LIMIT`` (llguidance then writes them without an exponent), so
none overflows to an infinity the parsers reject. Free-form objects, arrays and untyped values use
a recursive "safe JSON" definition with the same string and number rules for keys and values.

Local ``$ref``s (``#/$defs/NAME``, ``#/definitions/NAME``, JSON pointers into the tool's schema) are
read through the tool's `SchemaDocument`: the kinds, string removal and string literals look through
them like the parsers do, and each JSON value is a standalone bundle of the parameter's schema whose
refs point into its own ``$defs`` (recursion stays a ref, which llguidance resolves lazily).
JSON values keep every keyword llguidance implements (``minLength``, ``maxLength``, ``pattern``,
``format``, ``minimum``, ``maximum``, ``enum``, ...), strict tool or not; keywords it does not implement
(``not``, ``if``, ...) are ignored (llguidance ``lenient``), in every tool syntax alike.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

import llguidance

from helios.frontend.structured.grammar import GrammarError
from helios.frontend.structured.grammar_escaped import ESCAPED_CHAR, escape_text, escaped_keywords, escaped_search
from helios.frontend.structured.grammar_strings import FREE, RawString, StringBounds, raw_string
from helios.frontend.structured.grammar_lark import (
    ESCAPED_TEXT,
    LarkRules,
    Spelling,
    avoiding,
    free_text,
    lark_of,
    not_containing,
    regex_escape,
    search_regex,
    text_spelling,
    text_then,
)
from helios.frontend.parsers.calls import ValueFormat
from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.parsers.values import STRING_ONLY, TypedValue, ValueKind, dump_json, schema_kinds, typed_value

SAFE_JSON = "helios_safe_json"
NUMBER_LIMIT = 1e15  # unbounded JSON numbers: |x| <= 1e15, written without an exponent (always finite)
# The largest minLength/maxLength a raw string value takes together with a pattern or a minLength:
# llguidance checks such a value's lexeme (an intersection) within a fixed fuel that larger counts exhaust.
MAX_COUNTED_LEN = 1000
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_ENTITY_PATTERN = "^(?:[^<>&]|&(?:amp|lt|gt|apos);)*$"
_TEXT_PATTERN = "^[^<>&]*$"  # escaped text without entities: it reads as many characters as it spells


@dataclass(frozen=True)
class ValueStyle:
    """How one tool syntax writes values: format, wrapping text, the markup flag that declares
    a value raw (``flag[0]``) or JSON (``flag[1]``) when the syntax has one, and ``cuts``: texts
    that end a value before its closer in the parser (`ToolGrammar.value_end_tags`: Qwen Coder's
    ``<parameter=`` and ``</function>`` after the value wrap), which a raw value must not spell."""

    format: ValueFormat = ValueFormat.RAW
    wrap: str = ""
    flag: tuple[str, str] | None = None
    cuts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParameterValue:
    """A value rule: ``flag`` is the markup flag text to write (or ""), ``rule`` the value grammar
    followed by its closer."""

    flag: str
    rule: str


def string_pattern(style: ValueStyle, closer: str) -> str:
    if style.format is ValueFormat.XML_ESCAPED:
        return _ENTITY_PATTERN
    return f"^{not_containing(closer)}$"


def safe_json_definition(pattern: str) -> dict:
    """Any JSON value whose strings and keys match ``pattern``."""
    ref = {"$ref": f"#/$defs/{SAFE_JSON}"}
    return {"anyOf": [
        {"type": "null"}, {"type": "boolean"}, {"type": "number", "minimum": -NUMBER_LIMIT, "maximum": NUMBER_LIMIT},
        {"type": "string", "pattern": pattern},
        {"type": "array", "items": ref},
        {"type": "object", "patternProperties": {pattern: ref}, "additionalProperties": False},
    ]}


_COMPOSITE = ("anyOf", "oneOf", "allOf", "prefixItems")
_CONSTRAINING = ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "properties", "items", "not")
_DATA_KEYWORDS = ("enum", "const", "default", "examples")  # JSON values, not schemas
_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # names -> schemas


def safe_schema(schema: Any, pattern: str) -> Any:
    """``schema`` with free-form strings, keys and values limited to ``pattern`` (a copy)."""
    ref = {"$ref": f"#/$defs/{SAFE_JSON}"}
    if schema is True or schema == {}:
        return ref
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if not any(key in out for key in _CONSTRAINING):  # any value, its string keywords held as below
        if pattern == _ENTITY_PATTERN:
            out, as_written = escaped_keywords(out)
            if as_written:
                out["allOf"] = [{"pattern": _TEXT_PATTERN}]
        return {**out, **ref}
    for key in _COMPOSITE:
        if isinstance(out.get(key), list):
            out[key] = [safe_schema(branch, pattern) for branch in out[key]]
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(out.get(key), Mapping):
            out[key] = {name: safe_schema(value, pattern) for name, value in out[key].items()}
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
    counted = pattern
    if pattern == _ENTITY_PATTERN:
        out, as_written = escaped_keywords(out)
        counted = _TEXT_PATTERN if as_written else pattern
    if isinstance(out.get("enum"), list):  # string values are filtered here: intersecting each is costly
        out["enum"] = [value for value in out["enum"] if not isinstance(value, str) or _matches(pattern, value)]
    if isinstance(out.get("const"), str) and not _matches(pattern, out["const"]):
        del out["const"]
        out["enum"] = []  # its one value cannot be written
    if "pattern" in out or "format" in out:
        # the client's own string constraint, intersected with the safe pattern (it replaced it, so a
        # pattern like ".*" let a JSON string hold the value closer; an unknown format is ignored)
        out["allOf"] = [*out.get("allOf", ()), {"pattern": counted}]
    elif "string" in types and "enum" not in out and "const" not in out or counted is _TEXT_PATTERN:
        out["pattern"] = counted
    if "number" in types and not any(key in out for key in (*_BOUNDS, "enum", "const")):
        out.update(minimum=-NUMBER_LIMIT, maximum=NUMBER_LIMIT)
    if "array" in types or "items" in out:
        out["items"] = safe_schema(out.get("items", True), pattern)
    if ("object" in types or "properties" in out) and "patternProperties" not in out:
        extra = out.get("additionalProperties", True)
        declared = out.get("properties")
        if extra is not False and (_refers(declared) or (declared and extra is not True and extra != {})):
            # The safe key pattern applies to the declared keys too (patternProperties do): llguidance
            # cannot intersect a `$ref` (recursion) with it, and a declared value would have to satisfy
            # the undeclared values' own schema as well (a string property beside integer extras could
            # never be written). Such an object takes its declared keys only, which every value it
            # allows also satisfies.
            out["additionalProperties"] = False
        elif extra is not False:
            out["patternProperties"] = {pattern: safe_schema(extra, pattern)}
            out["additionalProperties"] = False
    return out


def safe_bundle(schema: Any, source: SchemaDocument, pattern: str) -> dict:
    """`schema` (a subschema of `source`) as a standalone document whose strings and keys match
    `pattern` (`safe_schema`), with the safe JSON definition where it is used.

    A definition left no value (``enum: []``: each of its string values broke `pattern`) is written
    where it is used instead of referred to: llguidance compiles every referenced definition on its
    own and refuses the whole document for an empty one ("anyOf is empty"), even one only an optional
    property or an array's items use, which the inline ``enum: []`` merely leaves out."""
    bundle = source.bundled(schema, reserved=(SAFE_JSON,))
    document = safe_schema(bundle if isinstance(bundle, Mapping) else {}, pattern)
    definitions = document.get("$defs")
    if isinstance(definitions, dict):
        emptied = {f"#/$defs/{name}" for name, value in definitions.items()
                   if isinstance(value, Mapping) and value.get("enum") == []}
        if emptied:
            document = _inline_emptied(document, emptied)
            document["$defs"] = {name: value for name, value in document["$defs"].items()
                                 if f"#/$defs/{name}" not in emptied}
    if f"#/$defs/{SAFE_JSON}" in json.dumps(document):
        document.setdefault("$defs", {})[SAFE_JSON] = safe_json_definition(pattern)
    return document


def _inline_emptied(schema: Any, emptied: set[str], is_name_map: bool = False) -> Any:
    """``schema`` (a copy) with each ``$ref`` to one of the `emptied` definitions replaced by
    ``enum: []`` under the ref's sibling keywords (the definition's own keywords allow nothing more).
    `is_name_map`: ``schema`` maps names to schemas (``properties`` ...), whatever the names."""
    if isinstance(schema, list):
        return [_inline_emptied(item, emptied) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    if is_name_map:
        return {name: _inline_emptied(value, emptied) for name, value in schema.items()}
    if isinstance(schema.get("$ref"), str) and schema["$ref"] in emptied:
        return {**{key: value for key, value in schema.items() if key != "$ref"}, "enum": []}
    return {key: value if key in _DATA_KEYWORDS else _inline_emptied(value, emptied, key in _NAME_MAPS)
            for key, value in schema.items()}


def _refers(schema: Any) -> bool:
    """Whether ``schema`` holds a ``$ref`` anywhere."""
    if isinstance(schema, Mapping):
        return "$ref" in schema or any(_refers(value) for value in schema.values())
    if isinstance(schema, list):
        return any(_refers(value) for value in schema)
    return False


@functools.lru_cache(maxsize=16)
def _safe_regex(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.DOTALL)


def _matches(pattern: str, text: str) -> bool:
    """Whether ``text`` is a string value the safe ``pattern`` (`string_pattern`) allows."""
    return _safe_regex(pattern).fullmatch(text) is not None


def without_strings(schema: Any, document: SchemaDocument | None = None,
                    visiting: frozenset[str] = frozenset()) -> Any | None:
    """``schema`` minus its string alternatives (None when nothing else is left).

    With ``document``, a ``$ref`` of the schema or of its ``anyOf``/``oneOf``/``allOf`` branches is
    replaced by its target first; a ref already on the path (``A = anyOf[A, ...]``) adds nothing
    and its branch is dropped.
    """
    if document is not None:
        followed = document.follow(schema, visiting)
        if followed is None:
            return None
        schema, visiting = followed
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    declared = out.get("type")
    if declared == "string":
        return None
    if isinstance(declared, list):
        out["type"] = [t for t in declared if t != "string"]
        if not out["type"]:
            return None
    if isinstance(out.get("enum"), list):
        out["enum"] = [v for v in out["enum"] if not isinstance(v, str)]
        if not out["enum"]:
            return None
    if isinstance(out.get("const"), str):
        return None
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            branches = (without_strings(branch, document, visiting) for branch in out[key])
            out[key] = [branch for branch in branches if branch is not None]
            if not out[key]:
                return None
    if isinstance(out.get("allOf"), list):
        conjuncts = [branch for branch in out["allOf"] if not _is_repeat(branch, visiting)]
        out["allOf"] = [without_strings(branch, document, visiting) for branch in conjuncts]
        if any(branch is None for branch in out["allOf"]):
            return None  # a conjunct that allows only strings
    return out


NULLABLE_STRING = frozenset({ValueKind.STRING, ValueKind.NULL})
_STRING_KEYWORDS = ("allOf", "oneOf", "not", "minLength", "maxLength", "pattern", "format")


def mixed_string_literals(schema: Any, document: SchemaDocument, kinds: frozenset[ValueKind]) -> tuple[str, ...]:
    """The string ``enum``/``const`` values of a parameter of several `kinds` (a subschema of
    ``document``) that the schema allows and the parsers read back as those strings (``"1"`` beside
    integers reads as 1): the top level's own (its ``$ref`` followed) where its ``type`` allows
    strings, else those of its ``anyOf`` branches that allow only strings. They are raw text beside
    the JSON value of the rest (`without_strings`), which cannot spell a string the parsers read as
    one. Empty where the top level says more about strings (``allOf``, ``oneOf``, string keywords,
    values beside ``anyOf``): its strings stay unwritten, as every free string of such a parameter is."""
    top = document.deref(schema)
    if not isinstance(top, Mapping) or any(key in top for key in _STRING_KEYWORDS):
        return ()
    declared = top.get("type", "string")
    if "string" not in (declared if isinstance(declared, list) else [declared]):
        return ()
    branches = top.get("anyOf")
    if "enum" in top or "const" in top:
        if branches is not None:
            return ()
        candidates = raw_string({k: top[k] for k in ("enum", "const") if k in top}, document).allowed_literals()
    else:
        candidates = tuple(text for branch in (branches if isinstance(branches, list) else [])
                           if schema_kinds(branch, document) == STRING_ONLY
                           for text in raw_string(branch, document).allowed_literals() or ())
    return tuple(text for text in dict.fromkeys(candidates or ())
                 if typed_value(text, kinds) == TypedValue(dump_json(text), True))


def mixed_free_string(schema: Any, document: SchemaDocument) -> bool:
    """Whether a parameter of several kinds (a subschema of ``document``) allows any string: its top
    level (its ``$ref`` followed) says nothing more about strings (`mixed_string_literals`' rule) and
    its ``type`` list names ``string``, or one of its ``anyOf`` branches is an unbounded string (no
    ``minLength``, ``maxLength``, ``pattern``, ``enum``/``const`` nor ``format``). Forced, such a value
    was JSON of its other kinds only: ``int | str`` could never be a string."""
    top = document.deref(schema)
    if not isinstance(top, Mapping) or any(key in top for key in (*_STRING_KEYWORDS, "enum", "const")):
        return False
    declared = top.get("type")
    types = declared if isinstance(declared, list) else [declared]
    branches = top.get("anyOf")
    if not isinstance(branches, list):
        return "string" in types
    if declared is not None and "string" not in types:
        return False
    return any(_is_free_string(branch, document) for branch in branches)


def _is_free_string(schema: Any, document: SchemaDocument) -> bool:
    """Whether ``schema`` allows only strings, any string: a ``format`` keyword anywhere in it (its
    refs followed) is a bound raw text cannot hold (`raw_string` reads none). The keyword only: a
    description or title mentioning "format" left an ``int | str`` parameter's strings unwritten."""
    if schema_kinds(schema, document) != STRING_ONLY or any("format" in node for node in document.reachable(schema)):
        return False
    try:
        return raw_string(schema, document) == FREE
    except GrammarError:  # differently bounded alternatives: bounded
        return False


# What Python's str.strip() removes (str.isspace), which the parsers strip from a typed value.
_STRIPPED = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in map(chr, range(0x3001)) if c.isspace()) + "]"
_JSON_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+\-]?[0-9]+)?"


def _other_kinds(kinds: frozenset[ValueKind]) -> tuple[str, str]:
    """(a regex (Rust syntax) of the stripped value texts the parsers read as a kind other than a
    string (`typed_value`), or somewhat more: every JSON number where integers or numbers are
    allowed, every text opening with ``{`` or ``[`` where objects or arrays are; the characters such
    a JSON value starts with)."""
    alternatives, starts = [], ""
    if kinds & {ValueKind.INTEGER, ValueKind.NUMBER}:
        alternatives.append(_JSON_NUMBER)
        starts += "-0-9"
    if ValueKind.BOOLEAN in kinds:
        alternatives.append("[tT][rR][uU][eE]|[fF][aA][lL][sS][eE]")
        starts += "tf"
    if ValueKind.NULL in kinds:
        alternatives.append("null|None")
        starts += "n"
    if ValueKind.OBJECT in kinds:
        alternatives.append(r"\{(?s:.*)")
        starts += r"\{"
    if ValueKind.ARRAY in kinds:
        alternatives.append(r"\[(?s:.*)")
        starts += r"\["
    return "|".join(alternatives), starts


def _reads_as_other(literal: str, kinds: frozenset[ValueKind]) -> bool:
    """Whether the free text of a mixed parameter (`ValueGrammar._read_as_string`) leaves `literal`
    out: it reads, stripped, as the start of another kind's text (`_other_kinds`). Such a literal is
    written beside the JSON value alone, the free string then not (three alternatives of one value
    are lexemes llguidance's longest match cannot always tell apart: ``3`` was refused beside the
    literal ``3.5`` and a free string)."""
    alternatives, _ = _other_kinds(kinds)
    return bool(alternatives) and re.fullmatch(f"(?:{alternatives})", literal.strip()) is not None


def without_null_branches(schema: Any, document: SchemaDocument) -> Any:
    """``schema`` (its ``$ref`` followed) without the ``anyOf``/``oneOf`` alternatives that allow only
    null: the string part of a nullable string, whose bounds those alternatives would free."""
    if isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        schema = document.deref(schema)
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [b for b in out[key] if schema_kinds(b, document) != frozenset({ValueKind.NULL})]
    return out


def _is_repeat(schema: Any, visiting: frozenset[str]) -> bool:
    ref = schema.get("$ref") if isinstance(schema, Mapping) else None
    return isinstance(ref, str) and ref in visiting


class ValueGrammar:
    """Builds parameter value rules for one tool syntax inside one grammar build.

    ``json_options`` are llguidance JSON options (``x-guidance``) applied to every JSON value.
    """

    def __init__(self, rules: LarkRules, style: ValueStyle, closer: Spelling, json_options: Mapping):
        self._rules = rules
        self._style = style
        self._closer = closer
        self._pattern = string_pattern(style, "".join(p.text for p in closer))
        self._options = {**json_options, "lenient": True}
        # Texts that would cut a raw value short in the parser (an escaped value holds no "<" or ">",
        # so it cannot spell them). A JSON value holds none either: JSON writes a newline inside a
        # string as an escape, and its whitespace is followed by no "<".
        escaped = style.format is ValueFormat.XML_ESCAPED
        self._cuts = [text_spelling(text) for text in style.cuts if not (escaped and set(text) & set("<>"))]

    def value(self, schema: Any, document: SchemaDocument) -> ParameterValue:
        """The value rule of a parameter with ``schema`` (a subschema of the tool's ``document``)."""
        kinds = schema_kinds(schema, document)
        flag = self._style.flag
        if flag is not None:
            if kinds == STRING_ONLY:
                return ParameterValue(flag[0], self._string(raw_string(schema, document)))
            return ParameterValue(flag[1], self._json(schema, document))
        if not kinds or kinds == STRING_ONLY:
            return ParameterValue("", self._string(raw_string(schema, document)))
        if kinds == NULLABLE_STRING:
            text = self._string(raw_string(without_null_branches(schema, document), document), nullable=True)
            null = self._json({"type": "null"}, document)
            return ParameterValue("", self._rules.rule("nullable", f"{text} | {null}"))
        if ValueKind.STRING in kinds:
            literals = mixed_string_literals(schema, document, kinds)
            is_free = mixed_free_string(schema, document)
            schema = without_strings(schema, document)
            if schema is None:  # an enum's other values were left out here: they hold no non-string value
                return ParameterValue("", self._string(RawString(literals) if literals else FREE))
            if is_free and any(_reads_as_other(literal, kinds) for literal in literals):
                is_free = False  # a literal the free text leaves out ("3.5" beside integers) stays writable
            if is_free or literals:
                text = self._read_as_string(kinds) if is_free else self._string(RawString(literals))
                return ParameterValue("", self._rules.rule("mixed", f"{self._json(schema, document)} | {text}"))
        return ParameterValue("", self._json(schema, document))

    def _string(self, text: RawString, nullable: bool = False) -> str:
        literals = text.allowed_literals()
        closer = lark_of(self._closer)
        escaped = self._style.format is ValueFormat.XML_ESCAPED
        if literals is not None:
            if not literals:
                raise GrammarError("none of its enum/const values is a string that its minLength, maxLength and "
                                   "pattern allow, so no value can be written")
            if escaped:
                literals = [escape_text(text) for text in literals]
            allowed = [t for t in literals if spelled_closer(self._closer) not in t and not self._is_cut(t)]
            if not allowed:  # the value would be left free: none of the schema's values can be written
                cuts = "".join(f" or {cut[0].text!r}" for cut in self._cuts)  # tags that would end it early
                raise GrammarError(f"each of its enum/const values holds the value closer "
                                   f"{spelled_closer(self._closer)!r}{cuts}, so none can be written as this value")
            return self._literals(allowed)
        if text.bounds != StringBounds():
            return self._bounded(text.bounds, nullable)
        if escaped:
            text = free_text(self._rules, escaped=True)
            return self._rules.rule("string", f"{text}? {closer}")
        return text_then(self._rules, [self._closer], avoid=self._cuts)[0]

    def _read_as_string(self, kinds: frozenset[ValueKind]) -> str:
        """The wrap, then raw text and the closer, that the parsers read back as a string under
        `kinds`: no text of another kind (`_other_kinds`), which the JSON value beside it writes.
        Like any raw value it never holds the closer nor a cut (`ValueStyle.cuts`); escaped, it is
        escaped text (its entities decode to no character another kind's text holds).

        llguidance's lexer takes the longest lexeme and does not go back, so the text must not be
        able to go on where the JSON value beside it ends: after another kind's text, no character
        that may follow that value (the wrap's or the closer's first), nor a JSON value's first
        character right after the wrap, nor anything after ``{`` or ``[`` (a JSON object or array is
        several lexemes). Those strings stay unwritten (``3\\n...``, ``3<...``)."""
        alternatives, starts = _other_kinds(kinds)
        other = f"{_STRIPPED}*(?:{alternatives})"
        head = self._closer[0] if self._closer and not self._closer[0].is_token else None
        wrap = self._style.wrap
        follows = "".join(dict.fromkeys(text[0] for text in (wrap, head.text if head else "") if text))
        escaped = self._style.format is ValueFormat.XML_ESCAPED
        lazy = head is not None and not escaped  # one lexeme of the text and the closer's text
        excluded = [f"{other}{_STRIPPED}*{regex_escape(head.text) if lazy else ''}"]
        if follows:
            excluded.append(f"{other}[{regex_escape(follows)}](?s:.)*")
        if wrap:
            excluded.append(f"{regex_escape(wrap)}[{starts}](?s:.)*")
        opens = "".join(regex_escape(text) for kind, text in ((ValueKind.OBJECT, "{"), (ValueKind.ARRAY, "["))
                        if kind in kinds)
        if opens:
            excluded.append(f"{_STRIPPED}*[{opens}](?s:.)*")
        negated = " & ".join(f"~/{text}/" for text in excluded)
        closer = lark_of(self._closer)
        opening = self._wrap()
        if escaped:  # text without "<": it ends where the closer starts
            text = self._rules.terminal("etext", f"/{ESCAPED_TEXT}+/ & {negated}")
            return self._rules.rule("string", f"{opening}{text}? {closer}")
        if not lazy:  # before a closer token: the text, or nothing (an empty string)
            text = self._rules.terminal("text", avoiding(f"/(?s:.+)/ & {negated}", [self._closer, *self._cuts]))
            return self._rules.rule("string", f"{opening}{text}? {closer}")
        stop = regex_escape(head.text)
        lexeme = avoiding(f"/{not_containing(head.text)}{stop}/ & {negated}", self._cuts)
        value = self._rules.rule("lazy", lexeme, "lazy")
        return self._rules.rule("string", " ".join(filter(None, (opening + value, lark_of(self._closer[1:])))))

    def _is_cut(self, text: str) -> bool:
        """Whether the parser would cut the raw value `text`, wrapped as written, before its end."""
        wrapped = f"{self._style.wrap}{text}{self._style.wrap}"
        return any(cut[0].text in wrapped for cut in self._cuts)

    def _literals(self, texts: list[str]) -> str:
        """A raw string value that is one of `texts` (none holds the closer), then the closer: one
        lexeme of the wrap, the value, the wrap and the closer's leading text. As parser alternatives
        (one Lark literal each) a forced call of an enum of more than about 2000 values compiled and
        passed the check, then met llguidance's items-per-row limit at the value, in every output."""
        wrap = regex_escape(self._style.wrap)
        optional = f"(?:{wrap})?" if wrap else ""
        head = self._closer[0] if self._closer and not self._closer[0].is_token else None
        stop, rest = (regex_escape(head.text), self._closer[1:]) if head else ("", self._closer)
        spelled = [regex_escape(text) for text in texts if text]
        empty = "?" if len(spelled) < len(texts) else ""  # the empty string is one of them
        if stop or wrap:
            value = self._rules.terminal("enum", f"/{optional}(?:{'|'.join(spelled)}){empty}{optional}{stop}/")
        else:  # before a closer token a lexeme must not match the empty text: an empty value is no lexeme
            value = f"{self._rules.terminal('enum', '/(?:' + '|'.join(spelled) + ')/')}{empty}" if spelled else ""
        return self._rules.rule("enum", " ".join(filter(None, (value, lark_of(rest)))))

    def _bounded(self, bounds: StringBounds, nullable: bool = False) -> str:
        """A raw string value held to `bounds`, then the closer. The value never holds the closer's
        text (nor, escaped, an entity: its text is then the value itself). Before a text closer, a
        maxLength alone is one lazy lexeme of the value and the closer's text (every prefix of a value
        is one, so it ends at the first closer); other bounds intersect in one lexeme that writes the
        wrap on both sides, so the parser, which strips it, reads exactly the value matched. A `nullable`
        value's lazy lexeme also spells ``null`` (the JSON null beside it is never reached once the
        lazy lexeme holds its first characters). Escaped, lengths count decoded characters (an entity is
        one) and patterns hold for the decoded text (`escaped_search`); a pattern that cannot be carried
        over holds for text without entities, which reads as written."""
        escaped = self._style.format is ValueFormat.XML_ESCAPED
        searches = [_raw_search(pattern, escaped) for pattern in bounds.patterns]
        as_written = any(written for _, written in searches)
        char = ("[^<>&]" if as_written else ESCAPED_CHAR) if escaped else "(?s:.)"
        wrap = regex_escape(self._style.wrap)
        head = self._closer[0] if self._closer and not self._closer[0].is_token else None
        stop, rest = (regex_escape(head.text), self._closer[1:]) if head else ("", self._closer)
        if bounds.is_prefix_closed and stop:
            optional = f"(?:{wrap})?" if wrap else ""
            text = f"{char}{{0,{bounds.max_len}}}"
            text = f"(?:{text}|null)" if nullable else text
            value = self._rules.rule("bounded", avoiding(f"/{optional}{text}{optional}{stop}/", self._cuts), "lazy")
            return self._rules.rule("string", " ".join(filter(None, (value, lark_of(rest)))))
        low = bounds.min_len if stop or wrap else max(bounds.min_len, 1)  # before a token: absent, not empty
        texts = [f"{char}{{{low},{'' if bounds.max_len is None else bounds.max_len}}}"]
        texts += [llguidance.regex_to_lark(search) for search, _ in searches]
        conjuncts = [f"/{wrap}(?:{text}){wrap}{stop}/" for text in texts]
        if stop and not escaped:
            conjuncts.append(f"/{not_containing(head.text)}{stop}/")
        joined = " & ".join(conjuncts)
        lexeme = avoiding(joined, [rest, *self._cuts])
        if (lexeme != joined or len(conjuncts) > 1) and max(bounds.min_len, bounds.max_len or 0) > MAX_COUNTED_LEN:
            raise GrammarError(f"minLength or maxLength above {MAX_COUNTED_LEN} cannot be enforced on a raw string "
                               "value together with minLength or a pattern (llguidance's lexer limits)")
        may_be_empty = not (stop or wrap) and bounds.min_len == 0 and not bounds.patterns
        value = self._rules.terminal("bounded", lexeme)
        return self._rules.rule("string", f"{value}{'?' if may_be_empty else ''} {lark_of(rest)}")

    def _json(self, schema: Any, source: SchemaDocument) -> str:
        document = safe_bundle(schema, source, self._pattern)
        document["x-guidance"] = self._options
        body = f"%json {json.dumps(document, ensure_ascii=False)}"
        return self._rules.rule("json", f"{self._wrap()}{body} {self._wrap()}{lark_of(self._closer)}")

    def _wrap(self) -> str:
        return f"{lark_of(text_spelling(self._style.wrap))}? " if self._style.wrap else ""


def _raw_search(pattern: str, escaped: bool) -> tuple[str, bool]:
    """(the regex a raw value's text fully matches, whether it holds for the text as written):
    escaped, the pattern's escaped language where `escaped_search` carries it over."""
    if escaped:
        written = escaped_search(pattern)
        if written is not None:
            return written, False
    search = search_regex(pattern)
    if search is None:
        raise GrammarError(f"pattern {pattern[:80]!r}: a raw string value takes ^ and $ only at "
                           "the ends of the pattern or of its top-level alternatives")
    return search, escaped


def spelled_closer(closer: Spelling) -> str:
    return "".join(piece.text for piece in closer)

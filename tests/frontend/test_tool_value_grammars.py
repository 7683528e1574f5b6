"""Tool-call value grammars against what the parsers read, at the edges earlier fuzzing left.

- XTML writes values XML-escaped and its parser decodes them: a string's ``pattern``, its
  ``enum``/``const`` values and object keys hold for the decoded text (`grammar_escaped`), in raw
  string values and in JSON values alike.
- Number bounds, enum/const integers and ``multipleOf`` values llguidance reads inexactly are a 400
  naming the keyword, its place and the limit (`grammar_shapes.number_error`), never llguidance's
  own text nor a value past the bound.
- Tag values that spell the value closer: a forced call never writes one the parser reads
  differently from the grammar (raw values end at the first closer; JSON values hold it only inside
  strings, which the parser reads through); control-token spellings inside values stay value text.
- DeepSeek V3.2 writes ``"\\n\\n"`` before its DSML block (``encoding_dsv32``): the family declares
  it as the block lead, so the answer text before a call neither ends with it nor streams it.

``HELIOS_TOOL_VALUE_SWEEP=N`` runs the forced-call sweep over N random tools per syntax (default 3),
with `support.schema_fuzz`'s generators widened by patterns, values and names that hold ``&``, ``<``
and ``>``.
"""

from __future__ import annotations

import json
import os
import random
import re

import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict

from helios.frontend.session import FrontendModel
from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, parse_response_format
from helios.frontend.structured.grammar_escaped import escape_text, escaped_search
from helios.frontend.structured.grammar_shapes import MAX_NUMBER_BOUND
from helios.ignition.frontend.families import BY_NAME
from helios.server.schemas import ChatCompletionRequest
from support import schema_fuzz

from .served import DEEPSEEK_THINK, JSON_DEFAULTS, dsml_frontend, ids_of, run_output, served_contract
from .test_grammar_tools import served_models
from .test_presentation import folded, streamed
from .test_schema_fuzz import call_arguments, forced, forced_calls, qwen_call, xtml_call

EOS = 1  # DeepSeek's <｜end▁of▁sentence｜>
DSML = "｜DSML｜"
SWEEP_TOOLS = int(os.environ.get("HELIOS_TOOL_VALUE_SWEEP", "3"))


@pytest.fixture(scope="module")
def models(qwen_tokenizer, deepseek_tokenizer):
    return served_models(qwen_tokenizer, deepseek_tokenizer, ("qwen", "dsml", "glm", "xtml"))


@pytest.fixture(scope="module")
def compiler(deepseek_tokenizer):
    return GrammarCompiler.from_tokenizer(deepseek_tokenizer, vocab_size=deepseek_tokenizer.get_vocab_size(),
                                          eos_token_ids=[EOS])


# -- XTML: escaped text held to what it decodes to ---------------------------------------------------

ESCAPE_PATTERNS = ["^a&b$", "&", "amp", "^.{3}$", "^[^a]+$", r"^\S{2}$", "(?i)^x<", "^(a|<)+$", "^[&<>]$",
                   "a.*b", "^(?:&|<){2}$", "lt;", "^&amp;$", "^[a-z&;]{1,5}$", "x|^<", r"^\W*$", "^[^&]*$",
                   ">$", "^[%-?]+$", r"^\d{2,3}$", "^(?:a|bc)*?x$", "(?i)[a-c]&", r"^[\s<]+$", "^[^\n]*$",
                   *schema_fuzz.PATTERNS]
DECODED_PIECES = ["a", "b", "c", "x", "X", "&", "<", ">", ";", "amp", "lt;", "\n", " ", "é", "1", "9", "-"]
WRITTEN_PIECES = ["a", "b", "x", "&", "<", ">", ";", "amp", "&amp;", "&lt;", "&gt;", "&apos;", "&AMP;", "&#38;"]


def finds(pattern: str, text: str) -> bool:
    """ECMA-262's search: "$" is the end of the text (Python's also matches before a final newline)."""
    return re.search(pattern.replace("$", r"\Z"), text) is not None


def decode(written: str) -> str:
    return re.sub(r"&(amp|lt|gt);", lambda m: {"amp": "&", "lt": "<", "gt": ">"}[m.group(1)], written)


@pytest.mark.parametrize("pattern", ESCAPE_PATTERNS)
def test_escaped_search_takes_exactly_the_escapings_of_the_strings_the_pattern_finds(compiler, deepseek_tokenizer,
                                                                                   pattern):
    regex = escaped_search(pattern)
    assert regex is not None
    rng = random.Random(pattern)
    matcher = compiler.compile(parse_response_format({"type": "regex", "regex": regex}))

    def takes(text: str) -> bool:
        probe = matcher.fork()
        ids = deepseek_tokenizer.encode(text, add_special_tokens=False).ids
        return all(probe.consume_token(t) for t in ids) and probe.is_accepting

    for decoded in schema_fuzz.PATTERNS.get(pattern, []):  # values known to match
        assert takes(escape_text(decoded)), decoded
    for _ in range(30):
        decoded = "".join(rng.choices(DECODED_PIECES, k=rng.randint(0, 5)))
        assert takes(escape_text(decoded)) == finds(pattern, decoded), decoded
        written = "".join(rng.choices(WRITTEN_PIECES, k=rng.randint(1, 5)))
        if takes(written):  # only a canonical escaping of a matching string
            assert escape_text(decode(written)) == written and finds(pattern, decode(written)), written


@pytest.mark.parametrize("pattern", [r"\p{L}+", "[[:alpha:]]", r"(a)\1", "(?=a)b", r"\bx", "^(a|b$)", "a++",
                                     "(?m)^a"])
def test_escaped_search_refuses_what_it_cannot_carry_over(pattern):
    assert escaped_search(pattern) is None


XTML_VALUES = [  # (parameter schema, written value, parsed value or None: refused by the grammar)
    ({"type": "string", "pattern": "^a&b$"}, "a&amp;b", "a&b"),  # refused: no value could be written
    ({"type": "string", "pattern": "^.{3}$"}, "a&amp;b", "a&b"),
    ({"type": "string", "pattern": "^.{3}$"}, "&amp;", None),  # 5 characters written, 1 read
    ({"type": "string", "pattern": "^[^a]+$", "maxLength": 3}, "&lt;&gt;b", "<>b"),
    ({"type": "string", "pattern": "^[^a]+$", "maxLength": 3}, "&lt;&gt;bc", None),
    ({"type": "string", "maxLength": 3}, "&lt;&gt;b", "<>b"),
    ({"type": "string", "pattern": r"^\p{L}+$"}, "ab", "ab"),  # not carried over: held as written
    ({"type": "array", "items": {"type": "string", "pattern": "^a&b$"}}, '["a&amp;b"]', ["a&b"]),
    ({"type": "array", "items": {"type": "string", "pattern": "^.{5}$"}}, '["&amp;"]', None),
    ({"type": "array", "items": {"type": "string", "pattern": "^.{5}$"}}, '["a&amp;bcd"]', ["a&bcd"]),
    ({"type": "array", "items": {"allOf": [{"type": "string"}, {"pattern": "^a&b$"}]}}, '["a&amp;b"]', ["a&b"]),
    ({"type": "array", "items": {"allOf": [{"type": "string"}, {"minLength": 4}]}}, '["&lt;"]', None),  # reads "<"
    ({"type": "array", "items": {"enum": ["a<b", "x"]}}, '["a&lt;b"]', ["a<b"]),
    ({"type": "array", "items": {"enum": ["&lt;", "x"]}}, '["&lt;"]', None),  # reads "<", not in the enum
    ({"type": "array", "items": {"enum": ["&lt;", "x"]}}, '["&amp;lt;"]', ["&lt;"]),
    ({"type": "array", "items": {"const": {"k<": "v&"}}}, '[{"k&lt;":"v&amp;"}]', [{"k<": "v&"}]),
    ({"type": "array", "items": {"type": "string", "format": "email"}}, '["a&lt;b@x.co"]', None),  # reads "a<b@..."
    ({"type": "object", "properties": {"a&lt;": {"type": "integer"}}, "required": ["a&lt;"],
      "additionalProperties": False}, '{"a&amp;lt;":1}', {"a&lt;": 1}),
    ({"type": "object", "properties": {"a&lt;": {"type": "integer"}}, "additionalProperties": False},
     '{"a&lt;":1}', None),  # reads key "a<"
    ({"type": "object", "patternProperties": {"^k.$": {"type": "integer"}}, "additionalProperties": False},
     '{"k&lt;":1}', {"k<": 1}),
    ({"type": "object", "patternProperties": {"^k.{4}$": {"type": "integer"}}, "additionalProperties": False},
     '{"k&lt;":1}', None),  # reads key "k<"
]


@pytest.mark.parametrize("schema, written, parsed", XTML_VALUES,
                         ids=[f"{i}:{json.dumps(case[0])[:40]}" for i, case in enumerate(XTML_VALUES)])
def test_xtml_values_are_held_to_what_the_parser_decodes(models, schema, written, parsed):
    """The grammar used to check patterns, enum/const values and keys on the escaped text, so it
    refused valid values (pattern "^a&b$", enum "a<b") and wrote invalid ones (enum "&lt;" reads "<")."""
    served = models["xtml"]
    parameters = {"type": "object", "properties": {"o": schema}, "required": ["o"]}
    prepared = forced(served, parameters)
    assert call_arguments(served, prepared, xtml_call({"o": written})) == (None if parsed is None else {"o": parsed})
    if parsed is not None and "\\p{" not in schema.get("pattern", ""):  # Python's re lacks \p{..}
        assert schema_fuzz.validate({"o": parsed}, parameters) == []


# -- number bounds llguidance reads inexactly ----------------------------------------------------------

INEXACT = [
    ("integer", "minimum", 2**53 + 1),  # read as 2**53, which it let through
    ("integer", "maximum", 999999999999999999),  # read as 1e18, which it let through
    ("integer", "minimum", 10**18),  # llguidance: "Failed to generate regex for integer range"
    ("integer", "exclusiveMaximum", -(10**18)),
    ("number", "maximum", 1e19),  # "Failed to generate regex for float range"
    ("number", "exclusiveMinimum", -1.5e18),
    ("integer", "maximum", 2**63 - 1),
    ("number", "minimum", 10**30),
    ("integer", "enum", [2**53 + 1, 1]),  # written as 2**53, not in the enum
    ("number", "const", {"a": [2**64 + 1]}),
    ("number", "multipleOf", 9e-10),  # "Value for 'multipleOf' has too many digits"
    ("integer", "multipleOf", 1e-11),
]


def chat_body(served, **fields) -> ChatCompletionRequest:
    body = {"model": served.model.served_id, "messages": [{"role": "user", "content": "go"}],
            "chat_template_kwargs": {"enable_thinking": False}, **fields}
    return ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize("kind, keyword, value", INEXACT)
def test_a_number_llguidance_reads_inexactly_is_a_400_naming_it(models, kind, keyword, value):
    served = models["qwen"]
    schema = {"type": kind, keyword: value}
    answer = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {
        "n": schema}, "required": ["n"]}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": schema}, "required": ["n"]}}}
    for fields, param in (({"response_format": answer}, "response_format"),
                          ({"tools": [tool], "tool_choice": "required"}, "tools[0].function.parameters")):
        with pytest.raises(GrammarError) as info:
            served.model.prepare_chat(chat_body(served, **fields))
        message = str(info.value)
        assert info.value.http_status == 400 and info.value.param == param, (info.value.param, message)
        assert f"{keyword} " in message and " at /properties/n" in message, message
        assert str(MAX_NUMBER_BOUND) in message if keyword != "multipleOf" else "16 digits" in message
        assert "Failed to generate" not in message and "too many digits" not in message


@pytest.mark.parametrize("kind, keyword, value, good, bad", [
    ("integer", "minimum", -MAX_NUMBER_BOUND, str(-MAX_NUMBER_BOUND), str(-MAX_NUMBER_BOUND - 1)),
    ("integer", "maximum", MAX_NUMBER_BOUND, str(MAX_NUMBER_BOUND), str(MAX_NUMBER_BOUND + 2)),
    ("number", "exclusiveMaximum", 1e15, "999999999999999", "1000000000000000"),
    ("number", "multipleOf", 3e-10, "0.0000000006", "0.0000000007"),
])
def test_a_number_within_the_limits_is_enforced(compiler, deepseek_tokenizer, kind, keyword, value, good, bad):
    matcher = compiler.compile(parse_response_format({"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": kind, keyword: value}}}))

    def takes(number: str) -> bool:
        probe = matcher.fork()
        ids = deepseek_tokenizer.encode(number, add_special_tokens=False).ids
        return all(probe.consume_token(t) for t in ids) and probe.is_accepting

    assert takes(good) and not takes(bad)


# -- tag values that spell the value closer -------------------------------------------------------------


def dsml_call(arguments: dict[str, str]) -> str:
    parameters = "".join(f'<{DSML}parameter name="{key}" string="true">{value}</{DSML}parameter>\n'
                         for key, value in arguments.items())
    return f'<{DSML}function_calls>\n<{DSML}invoke name="f">\n{parameters}</{DSML}invoke>\n</{DSML}function_calls>'


def glm_call(arguments: dict[str, str]) -> str:
    parameters = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n"
                         for key, value in arguments.items())
    return f"<tool_call>f\n{parameters}</tool_call>"


CALLS = {"qwen": (qwen_call, "\n</parameter>\n<parameter=b>\n"),
         "xtml": (xtml_call, '</xtml:arg>\n<xtml:arg name="b">'),
         "dsml": (dsml_call, f'</{DSML}parameter>\n<{DSML}parameter name="b" string="true">'),
         "glm": (glm_call, "</arg_value>\n<arg_key>b</arg_key>\n<arg_value>")}


@pytest.mark.parametrize("syntax", sorted(CALLS))
def test_a_forced_raw_value_never_holds_the_closer_before_a_tag(models, syntax):
    """A raw value ends at its first closer in the grammar as in the parser: text spelling the
    closer and a parameter tag is a second parameter where one is declared, and refused otherwise
    (the parser would read a parameter the tool does not declare)."""
    served = models[syntax]
    write, split = CALLS[syntax]
    value = f"x{split}y"
    one = forced(served, {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    assert call_arguments(served, one, write({"a": value})) is None
    two = forced(served, {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                          "required": ["a"]})
    assert call_arguments(served, two, write({"a": value})) == {"a": "x", "b": "y"}


QWEN_STRINGS = [{"type": "string"}, {"type": "string", "maxLength": 40}, {"type": "string", "minLength": 1},
                {"type": "string", "pattern": "y$"}, {"type": ["string", "null"]},
                {"type": ["string", "null"], "maxLength": 40}]


@pytest.mark.parametrize("schema", QWEN_STRINGS, ids=[json.dumps(schema) for schema in QWEN_STRINGS])
def test_a_forced_qwen_value_never_spells_a_tag_that_ends_it_unclosed(models, schema):
    """The parser ends a Qwen Coder value whose </parameter> was left out at the next parameter tag
    or the function closer after the value wrap (as vLLM's and Qwen's parsers do); the grammar let
    a forced value spell them, so "x\\n<parameter=b>\\ny" was read as a="x", b="y" and
    "x\\n</function>\\ny" as a="x" with the rest stray text."""
    served = models["qwen"]
    prepared = forced(served, {"type": "object", "properties": {"a": schema, "b": {"type": "string"}},
                               "required": ["a"]})
    for inner in ("\n<parameter=b>\n", "\n<parameter=a>", "\n</function>\n", "\n</function>"):
        assert call_arguments(served, prepared, qwen_call({"a": f"x{inner}y"})) is None, inner
    for inner in ("<parameter=b>", "</function>", "\n<parameter", "\n</functions"):  # no tag the parser ends at
        assert call_arguments(served, prepared, qwen_call({"a": f"x{inner}y"})) == {"a": f"x{inner}y"}, inner


def test_a_forced_qwen_enum_leaves_out_values_the_parser_would_cut(models):
    served = models["qwen"]

    def parameters(*values):
        return {"type": "object", "properties": {"a": {"enum": list(values)}}, "required": ["a"]}

    prepared = forced(served, parameters("x\n</function>\ny", "<parameter=b>", "ok"))
    assert call_arguments(served, prepared, qwen_call({"a": "x\n</function>\ny"})) is None
    assert call_arguments(served, prepared, qwen_call({"a": "<parameter=b>"})) is None  # the wrap writes "\n" before
    assert call_arguments(served, prepared, qwen_call({"a": "ok"})) == {"a": "ok"}
    with pytest.raises(GrammarError, match="so none can be written"):
        forced(served, parameters("x\n<parameter=b>y"))


MIXED_STRINGS = [  # (parameter schema, {written: parsed}, refused)
    ({"type": ["string", "integer"], "enum": ["a", "b"]}, {"a": "a"}, ["zzz", "3"]),  # any text or integer
    ({"anyOf": [{"type": "integer"}, {"const": "auto"}]}, {"auto": "auto", "3": 3}, ["zzz"]),  # "auto" refused
    ({"enum": [1, "one", None, "1"]}, {"one": "one", "1": 1, "null": None}, ["two"]),  # "one" refused
]


@pytest.mark.parametrize("syntax", ["qwen", "glm", "xtml"])
def test_a_forced_value_of_several_kinds_writes_exactly_its_string_enum_values(models, syntax):
    """The string enum/const values of a parameter that also allows other kinds were dropped with
    its string branches (a forced call could never write "auto" of ``int | Literal["auto"]``), and
    an enum of strings under ``type: [string, integer]`` left the value free: any text or integer.
    They are raw text now, those the parser reads back as strings ("1" beside integers reads 1)."""
    served = models[syntax]
    write = CALLS[syntax][0]
    for schema, taken, refused in MIXED_STRINGS:
        prepared = forced(served, {"type": "object", "properties": {"a": schema}, "required": ["a"]})
        for written, parsed in taken.items():
            assert call_arguments(served, prepared, write({"a": written})) == {"a": parsed}, (schema, written)
        for written in refused:
            assert call_arguments(served, prepared, write({"a": written})) is None, (schema, written)


FREE_MIXED = [  # (parameter schema, {written: parsed}, refused: texts no value of it is written as)
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]},
     {"Paris": "Paris", "3": 3, "3 apples": "3 apples", "null": "null", "True": "True", "": ""}, [" 3 ", "3.5"]),
    ({"type": ["integer", "string", "null"]}, {"x y": "x y", "-2": -2, "null": None}, ["None"]),
    ({"type": ["boolean", "string", "array"]}, {"true": True, "tomorrow": "tomorrow", "[1]": [1], "3": "3"},
     ["True", "[x"]),
    # a string literal the free text leaves out ("3.5", a number) keeps it writable, the free string then not
    # (as before the free strings: `json | literal`, where Qwen Coder's lexer cannot write "3" beside "3.5")
    ({"anyOf": [{"type": "integer"}, {"const": "3.5"}, {"type": "string"}]}, {"3.5": "3.5"}, ["3.25", "Paris"]),
    ({"anyOf": [{"type": "integer"}, {"const": "auto"}, {"type": "string"}]},
     {"auto": "auto", "Paris": "Paris", "3": 3}, ["3.5"]),
]


@pytest.mark.parametrize("syntax", ["qwen", "glm", "xtml"])
def test_a_forced_value_of_several_kinds_writes_any_string_where_the_schema_allows_one(models, syntax):
    """A forced ``int | str`` parameter (``anyOf`` or a ``type`` list) could only be written as an
    integer: its string branch was dropped, so "Paris" was refused. Any text the parser reads back as
    a string is written now; text it would read as another kind is the JSON value's to write."""
    served = models[syntax]
    write = CALLS[syntax][0]
    for schema, taken, refused in FREE_MIXED:
        prepared = forced(served, {"type": "object", "properties": {"a": schema}, "required": ["a"]})
        for written, parsed in taken.items():
            assert call_arguments(served, prepared, write({"a": written})) == {"a": parsed}, (schema, written)
        for written in refused:
            assert call_arguments(served, prepared, write({"a": written})) is None, (schema, written)


@pytest.mark.parametrize("syntax", ["qwen", "dsml", "xtml"])
def test_a_json_value_holds_the_closer_only_inside_strings_which_the_parser_reads_through(models, syntax):
    served = models[syntax]
    write, split = CALLS[syntax]
    closer = split.strip().split("\n")[0] if syntax != "qwen" else "</parameter>"
    key = f"k{closer}\n{closer}"
    schema = {"type": "object", "patternProperties": {"^k": {"type": "integer"}}, "additionalProperties": False}
    prepared = forced(served, {"type": "object", "properties": {"o": schema}, "required": ["o"]})
    text = write({"o": json.dumps({key: 1}, ensure_ascii=False)})
    if syntax == "dsml":
        text = text.replace('string="true"', 'string="false"')
    if syntax == "xtml":  # the written key holds "<" unescaped; the grammar writes it as "&lt;"
        assert call_arguments(served, prepared, text) is None
        text = write({"o": json.dumps({escape_text(key): 1})})
    assert call_arguments(served, prepared, text) == {"o": {key: 1}}


def test_a_json_value_whose_referenced_enum_all_holds_the_closer_leaves_that_key_out(models):
    """Each value of the enum behind the ``$ref`` holds ``</parameter>``, so a JSON value cannot write
    one; the key is optional (and an array's items may stay empty), so the value can be written
    without it: llguidance compiled the emptied definition on its own and the forced call grammar
    did not compile at all (a 400 for a valid request)."""
    served = models["qwen"]
    value = {"type": "object", "properties": {"m": {"$ref": "#/$defs/M"}, "l": {"type": "array", "items": {
        "$ref": "#/$defs/M"}}, "n": {"type": "integer"}}, "additionalProperties": False}
    parameters = {"type": "object", "properties": {"o": value}, "required": ["o"],
                  "$defs": {"M": {"enum": ["a</parameter>", "</parameter>"]}}}
    prepared = forced(served, parameters)
    assert call_arguments(served, prepared, qwen_call({"o": '{"l": [], "n": 1}'})) == {"o": {"l": [], "n": 1}}
    assert call_arguments(served, prepared, qwen_call({"o": '{"m": "a</parameter>"}'})) is None


@pytest.mark.parametrize("syntax", ["qwen", "xtml"])
def test_a_value_set_a_bounded_alternative_admits_adds_nothing(models, syntax):
    """anyOf [{maxLength: 4}, {const: "&lt;"}] was a 400 ("bound the text differently") though the
    const is one of the strings the maxLength allows (the escaping sweep drew it)."""
    served = models[syntax]
    write = CALLS[syntax][0]

    def parameters(*alternatives):
        return {"type": "object", "properties": {"s": {"anyOf": list(alternatives)}}, "required": ["s"]}

    prepared = forced(served, parameters({"type": "string", "maxLength": 4}, {"const": "&lt;"}))
    assert call_arguments(served, prepared, write({"s": escape_text("&lt;") if syntax == "xtml" else "&lt;"})) \
        == {"s": "&lt;"}
    assert call_arguments(served, prepared, write({"s": "abcd"})) == {"s": "abcd"}
    assert call_arguments(served, prepared, write({"s": "abcde"})) is None
    with pytest.raises(GrammarError, match="bound the text differently"):  # "long" is no string of maxLength 2
        forced(served, parameters({"type": "string", "maxLength": 2}, {"const": "long"}))


CONTROL_TEXTS = {"qwen": ["<|im_end|>", "<tool_call>", "</think>"],
                 "dsml": ["<｜end▁of▁sentence｜>", "</think>", DSML],
                 "glm": ["<｜end▁of▁sentence｜>", "<tool_call>"]}


@pytest.mark.parametrize("syntax", sorted(CONTROL_TEXTS))
def test_control_token_spellings_inside_a_forced_value_are_never_misread(models, syntax):
    """Spelled with ordinary tokens a control token's text is value text to grammar and parser
    alike; encoded whole (a special token where the tokenizer has one) it is refused or read so too."""
    served = models[syntax]
    write, _ = CALLS[syntax]
    prepared = forced(served, {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    head, tail = write({"a": "\0"}).split("\0")
    for control in CONTROL_TEXTS[syntax]:
        value = f"x{control}y"
        by_char = [i for char in value for i in ids_of(served.tokenizer, char)]
        whole = ids_of(served.tokenizer, "x", control, "y")
        for spelled, must_take in ((by_char, True), (whole, False)):
            ids = ids_of(served.tokenizer, head) + spelled + ids_of(served.tokenizer, tail)
            probe = prepared.grammar.fork()
            if not all(probe.consume_token(t) for t in ids):
                assert not must_take, control
                continue
            _, final = run_output(prepared, ids + [served.eos])
            assert [json.loads(call.arguments) for call in final.result.tool_calls] == [{"a": value}], control


# -- DeepSeek V3.2: the "\n\n" before the DSML block is its block lead ----------------------------------


@pytest.fixture(scope="module")
def v32(deepseek_tokenizer):
    """A DeepSeek frontend with the deepseek-v3.2 family's tool syntax, as ignition declares it."""
    frontend = dsml_frontend(deepseek_tokenizer)
    frontend["tool_syntax"] = MessageToDict(BY_NAME["deepseek-v3.2"].tool_syntax, preserving_proto_field_name=True)
    bos = {"name": "bos_token", "text": "<｜begin▁of▁sentence｜>", "token_id": 0}
    contract = served_contract(deepseek_tokenizer.get_vocab_size(), frontend, [EOS], [bos])
    return FrontendModel.from_contract(contract, deepseek_tokenizer, DEEPSEEK_THINK, json_defaults=JSON_DEFAULTS)


WEATHER = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}


def test_deepseek_v32_answer_text_before_a_call_leaves_out_the_block_lead(v32, deepseek_tokenizer):
    """encoding_dsv32 renders content, "\\n\\n", then the block; the family declared no block lead,
    so the answer read "Let me check.\\n\\n" (streamed so too)."""
    body = {"model": v32.served_id, "messages": [{"role": "user", "content": "go"}], "tools": [WEATHER]}
    prepared = v32.prepare_chat(ChatCompletionRequest.model_validate(body))
    ids = ids_of(deepseek_tokenizer, "Let me check.", "\n\n", dsml_call({"a": "Paris"})) + [EOS]
    chunks, final = streamed(prepared, ids)
    assert final.result.content == "Let me check." and final.result.errors == ()
    assert [json.loads(call.arguments) for call in final.result.tool_calls] == [{"a": "Paris"}]
    assert folded(chunks[:-1])["content"] == "Let me check."  # the chunks before "[DONE]"
    one_by_one = [i for char in "Sure\n\n" for i in ids_of(deepseek_tokenizer, char)]
    chunks, final = streamed(prepared, one_by_one + ids_of(deepseek_tokenizer, dsml_call({"a": "x"})) + [EOS])
    assert (final.result.content, folded(chunks[:-1])["content"]) == ("Sure", "Sure")


def test_deepseek_v32_forced_call_may_start_with_the_block_lead(v32, deepseek_tokenizer):
    body = {"model": v32.served_id, "messages": [{"role": "user", "content": "go"}], "tools": [WEATHER],
            "tool_choice": "required"}
    prepared = v32.prepare_chat(ChatCompletionRequest.model_validate(body))
    ids = ids_of(deepseek_tokenizer, "\n\n", dsml_call({"a": "Paris"}))
    probe = prepared.grammar.fork()
    assert all(probe.consume_token(t) for t in ids)
    _, final = run_output(prepared, ids + [EOS])
    assert final.result.content == "" and [c.arguments for c in final.result.tool_calls] == ['{"a": "Paris"}']


# -- sweep: random tools, escape-heavy values, every tag syntax ------------------------------------------

ESCAPING_PATTERNS = {"^a&b$": ["a&b"], "^[<>&]{1,3}$": ["<", "&>"], "^.{3}$": ["a&b", "abc"], "&": ["&", "x&y"],
                     "^[^<]*$": ["", "a&>"]}
ESCAPING_LITERALS = ["a<b", "&lt;", "x&y", ">", "&amp;", {"k<": "&"}]
ESCAPING_NAMES = ["a<b", "k&", "&lt;"]


@pytest.mark.parametrize("syntax", ["qwen", "dsml", "glm", "xtml"])
def test_forced_calls_with_escaping_values_validate(models, monkeypatch, syntax):
    monkeypatch.setattr(schema_fuzz, "PATTERNS", {**schema_fuzz.PATTERNS, **ESCAPING_PATTERNS})
    monkeypatch.setattr(schema_fuzz, "LITERALS", schema_fuzz.LITERALS + ESCAPING_LITERALS)
    monkeypatch.setattr(schema_fuzz, "NAMES", schema_fuzz.NAMES + ESCAPING_NAMES)
    judged = forced_calls(models[syntax], random.Random(f"escaping {syntax}"), np.random.default_rng(7), SWEEP_TOOLS)
    assert judged >= SWEEP_TOOLS  # three outputs a tool, some ending by length


@pytest.mark.parametrize("syntax", ["qwen", "xtml"])
def test_a_free_string_branch_is_bounded_by_its_format_keyword_not_by_the_word_in_its_text(models, syntax):
    """An ``int | str`` parameter whose string branch's description (or title, or a property name
    elsewhere) held the word "format" was read as format-bounded: "Paris" was refused. Only the
    ``format`` keyword bounds the branch, also where a ``$ref`` inside an ``allOf`` brings it."""
    served = models[syntax]
    write = CALLS[syntax][0]
    described = {"anyOf": [{"type": "integer"},
                           {"type": "string", "title": "format", "description": "a city name, any format"}]}
    prepared = forced(served, {"type": "object", "properties": {"a": described}, "required": ["a"]})
    assert call_arguments(served, prepared, write({"a": "Paris"})) == {"a": "Paris"}
    assert call_arguments(served, prepared, write({"a": "3"})) == {"a": 3}
    dated = {"anyOf": [{"type": "integer"}, {"allOf": [{"$ref": "#/$defs/D"}]}]}
    dated = {"type": "object", "properties": {"a": dated}, "required": ["a"],
             "$defs": {"D": {"type": "string", "format": "date"}}}
    prepared = forced(served, dated)
    assert call_arguments(served, prepared, write({"a": "Paris"})) is None  # a format raw text cannot hold
    assert call_arguments(served, prepared, write({"a": "3"})) == {"a": 3}


GLM_KEYS = ['say "hi"', "two\nlines", "a>b", "q'uote"]


def test_a_forced_glm_call_writes_parameter_names_with_quotes_newlines_and_closing_brackets(models):
    """GLM writes a key as text between ``<arg_key>`` and ``</arg_key>`` (its template verbatim, vLLM's
    parser any text up to the closer, stripped), and so does its parser: only ``<`` ends it short. The
    forced-call grammar held every syntax to the captured names' rule (no ``"``, ``>`` or newline), so
    such a required parameter was a 400 and an optional one was never written."""
    served = models["glm"]
    schema = {"type": "object", "properties": {key: {"type": "string"} for key in GLM_KEYS}, "required": GLM_KEYS[:2]}
    prepared = forced(served, schema)
    arguments = {key: f"v{n}" for n, key in enumerate(GLM_KEYS)}
    assert call_arguments(served, prepared, glm_call(arguments)) == arguments
    with pytest.raises(GrammarError, match="holds no '<'") as info:  # "<" would end the key short
        forced(served, {"type": "object", "properties": {"a<b": {"type": "string"}}, "required": ["a<b"]})
    assert info.value.param == "tools[0].function.parameters.properties.a<b"

"""JSON-schema keywords clients send in `response_format`: each either constrains the answer (the
matcher takes the valid samples and refuses the invalid ones) or is a 400 naming it, never a 500 and
never silently dropped.

``additionalItems`` (the items after a draft-4 tuple's ``items`` list) is compiled by llguidance, but
the check did not walk it: a ``multipleOf`` there whose automaton takes seconds to build (99991: 1.4 s
on a 320-token vocabulary; 999983 took 15 s) passed the check and held a preparation worker, and its
patterns were never probed."""

from __future__ import annotations

import json

import pytest

from helios.errors import RequestError
from helios.frontend.structured.grammar import (GrammarCompiler, GrammarError, GrammarRequest,
                                                parse_response_format, schema_patterns)
from support.chat_checkpoint import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    eos = tokenizer.token_to_id("<|im_end|>")
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])


def request_of(schema: dict) -> GrammarRequest:
    return parse_response_format({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})


def matches(matcher, tokenizer, text: str) -> bool:
    probe = matcher.fork()
    for token_id in tokenizer.encode(text, add_special_tokens=False).ids:
        probe.bitmask()
        if not probe.consume_token(token_id):
            return False
    probe.bitmask()
    return probe.is_accepting


TUPLE = {"type": "array", "items": [{"type": "integer"}]}


def test_a_costly_multiple_of_after_a_tuple_is_refused_naming_it(compiler):
    schema = {**TUPLE, "additionalItems": {"type": "integer", "multipleOf": 99991}}
    with pytest.raises(GrammarError, match="multipleOf values whose least common multiple is 99991"):
        compiler.check(request_of(schema))


def test_the_patterns_after_a_tuple_are_probed(compiler):
    schema = {**TUPLE, "additionalItems": {"type": "string", "pattern": "^a{100000}$"}}
    assert schema_patterns(request_of(schema)) == {"^a{100000}$"}
    with pytest.raises(GrammarError, match="exceeds llguidance's limits"):
        compiler.check(request_of(schema))


CONSTRAINED = {
    "unicode class pattern": ({"type": "string", "pattern": "^\\p{Lu}\\p{Ll}*$"}, ['"Abc"'], ['"abc"', '"A1"']),
    "format date": ({"type": "string", "format": "date"}, ['"2020-01-31"'], ['"tomorrow"']),
    "format email with pattern": ({"type": "string", "format": "email", "pattern": "^a"}, ['"a@b.co"'],
                                  ['"b@b.co"']),
    "patternProperties, additionalProperties false": (
        {"type": "object", "properties": {"a": {"type": "string"}}, "patternProperties": {"^n_": {"type": "integer"}},
         "additionalProperties": False}, ['{"a":"x","n_1":2}', "{}"], ['{"z":1}', '{"n_1":"s"}']),
    "prefixItems, items false": ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                                  "items": False}, ['[1,"a"]'], ['["a",1]', '[1,"a",2]']),
    "tuple, additionalItems false": ({**TUPLE, "additionalItems": False}, ["[1]"], ["[1,2]"]),
    "const object": ({"const": {"a": 1, "b": [1, 2]}}, ['{"a":1,"b":[1,2]}'], ['{"a":2,"b":[1,2]}']),
    "minItems and maxItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
                              ["[1,2]", "[1,2,3]"], ["[1]", "[1,2,3,4]"]),
    "large maxItems": ({"type": "array", "items": {"type": "integer"}, "maxItems": 1_000_000}, ["[1,2]"], ['["a"]']),
    "$defs recursion": ({"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array",
                                                                                "items": {"$ref": "#/$defs/n"}}},
                                         "required": ["c"]}}, "$ref": "#/$defs/n"},
                        ['{"c":[{"c":[]}]}'], ["{}", '{"c":[{}]}']),
}


@pytest.mark.parametrize("name", list(CONSTRAINED))
def test_a_schema_keyword_constrains_the_answer(compiler, tokenizer, name):
    schema, valid, invalid = CONSTRAINED[name]
    matcher = compiler.compile(request_of(schema))
    assert [text for text in valid if not matches(matcher, tokenizer, text)] == []
    assert [text for text in invalid if matches(matcher, tokenizer, text)] == []


REFUSED = {
    "dependentRequired": ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    "if/then/else": ({"if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}, "else": {}}, '"if"'),
    "unknown format": ({"type": "string", "format": "uri-reference"}, "Unknown format: uri-reference"),
    "unknown unicode class": ({"type": "string", "pattern": "^\\p{Bogus}+$"}, "Unicode property not found"),
    "overlapping oneOf": ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    "huge minimum": ({"type": "integer", "minimum": 1e300}, "minimum"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_schema_keyword_llguidance_cannot_hold_is_a_400_naming_it(compiler, name):
    schema, named = REFUSED[name]
    with pytest.raises(RequestError) as caught:
        compiler.compile(request_of(schema))
    assert isinstance(caught.value, GrammarError) and named in str(caught.value), str(caught.value)
    json.dumps(schema)  # the schema itself was well-formed JSON

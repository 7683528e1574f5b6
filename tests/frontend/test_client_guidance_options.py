"""Which llguidance options (``x-guidance``) a client's schema may set (`grammar_options`).

llguidance reads a schema's top-level ``x-guidance`` as compile options. A client could set any of
them: a ``json_schema`` answer with ``whitespace_pattern: "[a-z]+"`` was written with letters
between its tokens (not JSON), and a Hermes tool whose ``whitespace_pattern`` spells
``</tool_call>`` got arguments holding the block closer, where the parser ends the call. Now only
``coerce_one_of``, ``lenient`` and ``whitespace_flexible`` (booleans) pass; anything else is a 400
naming the option, for a ``json_schema``, a ``%json`` schema in a Lark grammar (nested ``%lark``
grammars too) and a tool's parameters alike; the server's own options still win over a tool's.
"""

from __future__ import annotations

import json

import pytest

from helios.frontend.decoding.syntax import example_hermes
from helios.frontend.parsers import TokenDelimiters
from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, GrammarKind, parse_response_format
from helios.frontend.structured.grammar_json_calls import arguments_schema, json_calls_lark
from helios.frontend.structured.grammar_lark import Speller
from helios.frontend.structured.grammar_request import OutputConstraints
from helios.frontend.structured.grammar_tools import ToolSchema

from .parsers.conftest import small_bpe

EOS_TEXT = "<|endoftext|>"
OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
REFUSED = {
    "whitespace_pattern": "[a-z]+", "item_separator": ";", "key_separator": "=", "json_allowed_escapes": "n",
    "json_allow_general_unicode_escapes": True, "unknown_option": True,
}


@pytest.fixture(scope="module")
def model():
    tokenizer = small_bpe([EOS_TEXT, "<tool_call>", "</tool_call>"])
    eos = tokenizer.token_to_id(EOS_TEXT)
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])
    speller = Speller.from_tokenizer(tokenizer, compiler.is_special_token, TokenDelimiters())
    return tokenizer, eos, compiler, speller


def takes(model, matcher, *texts: str) -> bool:
    """Whether `matcher` takes `texts`, each tokenized on its own, then its end (EOS)."""
    tokenizer, eos = model[0], model[1]
    ids = [i for text in texts for i in tokenizer.encode(text, add_special_tokens=False).ids] + [eos]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_stopped


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("option", list(REFUSED))
def test_a_json_schema_format_option_that_can_break_json_is_a_400_naming_it(option):
    with pytest.raises(GrammarError) as caught:
        parse_response_format(json_schema_format({**OBJECT, "x-guidance": {option: REFUSED[option]}}))
    assert caught.value.http_status == 400 and caught.value.param == "response_format"
    assert f"'{option}'" in str(caught.value) and "response_format.json_schema.schema" in str(caught.value)


@pytest.mark.parametrize("options, what", [
    ({"lenient": "yes"}, "true or false"), ({"coerce_one_of": None}, "true or false"),
    ("lenient", "must be an object"), ([], "must be an object"),
])
def test_allowed_options_take_booleans_only(options, what):
    with pytest.raises(GrammarError, match=what):
        parse_response_format(json_schema_format({**OBJECT, "x-guidance": options}))


def test_the_allowed_options_still_hold(model):
    compiler = model[2]
    one_of = {"oneOf": [{"type": "integer"}, {"type": "string"}], "x-guidance": {"coerce_one_of": True}}
    assert takes(model, compiler.compile(parse_response_format(json_schema_format(one_of))), "7")
    spaced = parse_response_format(json_schema_format({**OBJECT, "x-guidance": {"whitespace_flexible": True,
                                                                                 "lenient": False}}))
    assert takes(model, compiler.compile(spaced), '{ "a" : 1 }')
    absent = parse_response_format(json_schema_format({**OBJECT, "x-guidance": None}))
    assert takes(model, compiler.compile(absent), '{"a":1}')


@pytest.mark.parametrize("grammar", [
    'start: %json {"type": "object", "x-guidance": {"item_separator": ";"}}\n',
    'start: "a" x\nx: %lark {\nstart: %json {"type": "integer", "x-guidance": {"whitespace_pattern": "q+"}}\n}\n',
])
def test_a_json_schema_inside_a_lark_grammar_is_held_to_the_same_options(grammar):
    with pytest.raises(GrammarError, match="its %json schema: x-guidance option") as caught:
        parse_response_format({"type": "grammar", "grammar": grammar})
    assert caught.value.param == "response_format"


def test_options_spelled_as_lark_text_are_not_schemas(model):
    grammar = ('start: "%json {\\"x-guidance\\": {\\"key_separator\\": \\"=\\"}}" | body\n'
               '// %json {"x-guidance": {"key_separator": "="}}\n'
               'body: %json {"type": "object", "x-guidance": {"whitespace_flexible": true}}\n')
    request = parse_response_format({"type": "grammar", "grammar": grammar})
    assert takes(model, model[2].compile(request), "{ }")


def test_a_tool_option_that_can_break_json_is_refused_before_its_grammar_is_built():
    tool = ToolSchema("f", {**OBJECT, "x-guidance": {"whitespace_pattern": "</tool_call>"}})
    with pytest.raises(GrammarError, match="'whitespace_pattern'"):
        tool.parameters_request()


def test_tool_arguments_never_spell_the_block_closer_through_the_tools_options(model):
    """The defect: a Hermes call's arguments took ``</tool_call>`` (as text) between JSON tokens.
    `arguments_schema` hands llguidance only the options a client may set, under the server's."""
    _, _, compiler, speller = model
    tool = ToolSchema("f", {**OBJECT, "x-guidance": {"whitespace_pattern": "</tool_call>"}})
    lark = json_calls_lark(example_hermes(), speller, [tool], True, compiler.json_options)
    matcher = compiler.compile_lark(lark, None)
    assert not takes(model, matcher, '<tool_call>\n{"name": "f", "arguments": {', "</", "tool_call>", '"a":1}}\n',
                     "</tool_call>")
    call = '<tool_call>\n{"name": "f", "arguments": {"a":1}}\n</tool_call>'
    assert takes(model, compiler.compile_lark(lark, None), call)


def test_the_servers_options_win_over_a_tools_and_its_allowed_ones_apply():
    tool = ToolSchema("f", {**OBJECT, "x-guidance": {"lenient": False, "whitespace_flexible": True}})
    options = json.loads(arguments_schema(tool, {"whitespace_flexible": False}))["x-guidance"]
    assert options == {"whitespace_flexible": True, "lenient": True}
    request = tool.parameters_request()
    assert request.kind is GrammarKind.JSON_SCHEMA
    assert json.loads(request.source)["x-guidance"] == {"lenient": True, "whitespace_flexible": True}


def test_a_tool_error_names_the_tool_and_its_parameters(model):
    constraints = OutputConstraints(None, model[2], model[3])  # the check reads the compiler only
    tools = ToolSchema.from_openai([{"type": "function", "function": {"name": "g", "parameters": OBJECT}},
                                    {"type": "function", "function": {"name": "f", "parameters": {
                                        **OBJECT, "x-guidance": {"key_separator": "</tool_call>"}}}}])
    with pytest.raises(GrammarError, match="tool 'f' parameters: x-guidance option 'key_separator'") as caught:
        constraints._check_tools(tools)
    assert caught.value.http_status == 400 and caught.value.param == "tools[1].function.parameters"

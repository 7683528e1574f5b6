"""Forced JSON-call grammars (`grammar_json_calls`): how many calls they let through, and that each
call's arguments are a JSON object.

A named ``tool_choice`` (and ``required`` with ``parallel_tool_calls: false``) allows exactly one
call; ``required`` with parallel calls one or more. Each JSON-call shape with a separator between
calls is checked on a small byte-level BPE whose markup is added special tokens: Hermes blocks
(``<tool_call>`` ... ``</tool_call>`` joined by newlines), Mistral's ``[TOOL_CALLS]`` array and
DeepSeek's markup calls. Before, a single call grammar demanded exactly two calls (the repetition
group was left bare), so a forced named call on Hermes, Mistral and DeepSeek families wrote the
named function twice.

A parameters schema whose top level also allows other values (``anyOf`` with a string branch,
``type: [object, null]``) let JSON-call and harmony grammars write arguments such as ``"x"`` or
``null``: the parsers refuse them, so a forced call came back as no call at all (a malformed-call
error and the markup as content). The grammars now hold the top level to an object, and a schema
that allows no object at all (``enum: [1]``, a ``$ref`` to an integer) is a 400 naming the tool.
"""

from __future__ import annotations

import pytest

from helios.frontend.decoding.syntax import JsonCallSyntax, example_deepseek_v3, example_hermes
from helios.frontend.parsers import TokenDelimiters
from helios.frontend.structured.grammar import GrammarCompiler, GrammarError
from helios.frontend.structured.grammar_json_calls import arguments_schema, json_calls_lark, optional_call_lark
from helios.frontend.structured.grammar_lark import Speller
from helios.frontend.structured.grammar_tools import ToolSchema

from .parsers.conftest import small_bpe

EOS_TEXT = "<|endoftext|>"
DEEPSEEK = example_deepseek_v3()
MARKUP = [EOS_TEXT, "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", DEEPSEEK.block_open, DEEPSEEK.block_close,
          "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", DEEPSEEK.invoke_close]
TOOLS = [ToolSchema("f", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})]
CALL = '{"name": "f", "arguments": {"a":1}}'
DEEPSEEK_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":1}\n```<｜tool▁call▁end｜>"
# (syntax, one call's output, two calls' output)
SHAPES = {
    "hermes": (example_hermes(), f"<tool_call>\n{CALL}\n</tool_call>",
               f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}\n</tool_call>"),
    "mistral": (JsonCallSyntax("[TOOL_CALLS]", name_key="name", arguments_key="arguments"), f"[TOOL_CALLS][{CALL}]",
                f"[TOOL_CALLS][{CALL}, {CALL}]"),
    # (each call opens with the block opener: one opener per call, no separator, as the template writes them)
    "mistral-args": (JsonCallSyntax("[TOOL_CALLS]", invoke_open="[TOOL_CALLS]", name_end="[ARGS]"),
                     '[TOOL_CALLS]f[ARGS]{"a":1}', '[TOOL_CALLS]f[ARGS]{"a":1}[TOOL_CALLS]f[ARGS]{"a":1}'),
    "deepseek": (DEEPSEEK, f"{DEEPSEEK.block_open}{DEEPSEEK_CALL}{DEEPSEEK.block_close}",
                 f"{DEEPSEEK.block_open}{DEEPSEEK_CALL}\n{DEEPSEEK_CALL}{DEEPSEEK.block_close}"),
}


@pytest.fixture(scope="module")
def model():
    tokenizer = small_bpe(MARKUP)
    eos = tokenizer.token_to_id(EOS_TEXT)
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])
    speller = Speller.from_tokenizer(tokenizer, compiler.is_special_token, TokenDelimiters())
    return tokenizer, eos, compiler, speller


def takes(model, lark: str, text: str) -> bool:
    """Whether the Lark grammar takes all of ``text`` and then its end (EOS)."""
    tokenizer, eos, compiler, _ = model
    matcher = compiler.compile_lark(lark, None)
    ids = tokenizer.encode(text, add_special_tokens=False).ids + [eos]
    return all(matcher.consume_token(token_id) for token_id in ids) and matcher.is_stopped


def is_complete(model, syntax: JsonCallSyntax, single: bool, text: str, tools=TOOLS) -> bool:
    return takes(model, json_calls_lark(syntax, model[3], tools, single, {}), text)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_single_forced_call_grammar_takes_exactly_one_call(model, shape):
    syntax, one, two = SHAPES[shape]
    assert (is_complete(model, syntax, True, one), is_complete(model, syntax, True, two)) == (True, False)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_parallel_forced_call_grammar_takes_one_or_more_calls(model, shape):
    syntax, one, two = SHAPES[shape]
    assert (is_complete(model, syntax, False, one), is_complete(model, syntax, False, two)) == (True, True)


LLAMA = (JsonCallSyntax(name_key="name", arguments_key="parameters"), '{"name": "f", "parameters": {"a":1}}',
         '{"name": "f", "parameters": {"a":1}}; {"name": "f", "parameters": {"a":1}}')


@pytest.fixture(scope="module")
def text_markup_model():
    """`model` with the markup spelled as text (no added tokens but EOS)."""
    tokenizer = small_bpe([EOS_TEXT])
    eos = tokenizer.token_to_id(EOS_TEXT)
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])
    return tokenizer, eos, compiler, Speller.from_tokenizer(tokenizer, compiler.is_special_token, TokenDelimiters())


@pytest.mark.parametrize("markup", ["tokens", "text"])
@pytest.mark.parametrize("shape", [*SHAPES, "llama"])
def test_an_optional_call_grammar_takes_text_or_one_call(model, text_markup_model, shape, markup):
    """``parallel_tool_calls: false`` without forcing (a 400 on JSON-call syntaxes before): free text,
    or text then exactly one call, nothing after it. Llama's answer is a call when it starts with
    JSON: text may not, and a call after text is text to the parser (taken as text here)."""
    model = model if markup == "tokens" else text_markup_model
    syntax, one, two = LLAMA if shape == "llama" else SHAPES[shape]
    lark = optional_call_lark(syntax, model[3], TOOLS, {})
    verdicts = {text: takes(model, lark, text) for text in
                ("", "It is sunny.", "  \n", one, two, f"Let me check. {one}", f"Let me check. {two}", f"{one} Done.")}
    has_opener = bool(syntax.block_open)
    assert verdicts == {"": True, "It is sunny.": True, "  \n": True, one: True, two: False,
                        f"Let me check. {one}": True, f"Let me check. {two}": not has_opener,
                        f"{one} Done.": False}, verdicts
    if not has_opener:  # text starting with JSON would be read as a (malformed) call
        assert not takes(model, lark, ' {"a": 1}') and not takes(model, lark, "[1]")


LOOSE_TOP_LEVELS = {
    "anyOf with a string branch": {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                             {"type": "string"}]},
    "an object or null": {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}},
    "oneOf with a null branch": {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                           {"type": "null"}]},
}


@pytest.mark.parametrize("case", list(LOOSE_TOP_LEVELS))
def test_json_call_arguments_are_an_object_whatever_else_the_top_level_allows(model, case):
    tool = [ToolSchema("f", LOOSE_TOP_LEVELS[case])]
    block = '<tool_call>\n{"name": "f", "arguments": %s}\n</tool_call>'
    verdicts = [is_complete(model, example_hermes(), True, block % value, tool) for value in ('{"a":1}', '"x"', "null")]
    assert verdicts == [True, False, False]


@pytest.mark.parametrize("case", list(LOOSE_TOP_LEVELS))
def test_harmony_call_arguments_are_an_object_whatever_else_the_top_level_allows(model, case):
    lark = f"start: %json {arguments_schema(ToolSchema('f', LOOSE_TOP_LEVELS[case]), {})}\n"
    assert [takes(model, lark, value) for value in ('{"a":1}', '"x"', "null")] == [True, False, False]


@pytest.mark.parametrize("parameters", [{"enum": [1, "x"]}, {"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}},
                                        {"allOf": [{"type": "string"}]}])
def test_parameters_that_allow_no_object_are_a_400(model, parameters):
    with pytest.raises(GrammarError, match="Unsatisfiable") as caught:
        model[2].check(ToolSchema("f", parameters).parameters_request())
    assert caught.value.http_status == 400


REF_TOP = {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]}}}


@pytest.mark.parametrize("shape", ["hermes", "mistral"])
def test_a_forced_json_call_writes_declared_properties_only_behind_a_top_level_ref(model, shape):
    """pydantic writes a recursive model's parameters as a top-level ``$ref`` to its definition: the
    declared-properties rule (``additionalProperties: false`` where the client set none, as the tag
    grammars write declared parameters only) looked for ``properties`` at the top only, so a forced
    call could add any key, ``{"a": 1, "zz": {...}}``."""
    syntax, one, _ = SHAPES[shape]
    tool = [ToolSchema("f", REF_TOP)]
    for arguments, verdict in (('{"a":1}', True), ('{"a":1,"b":["x"]}', True), ('{"a":1,"b":[1]}', False),
                               ('{"a":1,"zz":2}', False), ('{"b":["x"]}', False)):
        assert is_complete(model, syntax, True, one.replace('{"a":1}', arguments), tool) == verdict, arguments


@pytest.mark.parametrize("parameters, name", [
    ({"type": "object", "properties": {"a": {"const": "</tool_call>"}}, "required": ["a"]}, "a"),
    ({"type": "object", "properties": {"a": {"enum": ["x</tool_call>", "</tool_call>y"]}}, "required": ["a"]}, "a"),
    ({"type": "object", "properties": {"o": {"type": "object", "properties": {"b": {"const": "</tool_call>"}},
                                             "required": ["b"]}}, "required": ["o"]}, "o.b"),
    # behind a $ref (pydantic's enums), or a described one's allOf (pydantic v1): the 400 was llguidance's
    # own "Unsatisfiable schema: anyOf is empty", naming no tool or parameter; optional, the call could
    # not be written either (llguidance compiles a referenced definition on its own)
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/M"}}, "required": ["a"],
      "$defs": {"M": {"enum": ["</tool_call>"]}}}, "a"),
    ({"type": "object", "properties": {"a": {"allOf": [{"$ref": "#/definitions/M"}], "description": "mode"}},
      "required": ["a"], "definitions": {"M": {"const": "x</tool_call>"}}}, "a"),
])
def test_a_required_value_holding_the_block_closer_is_a_400_naming_the_parameter(model, parameters, name):
    """No such value can be written inside the block (the parser would end it there), so the call can
    not be written: the 400 was llguidance's bare "Unsatisfiable schema", naming no tool or parameter."""
    tool = [ToolSchema("f", parameters, 0)]
    with pytest.raises(GrammarError) as caught:
        model[2].compile_lark(json_calls_lark(example_hermes(), model[3], tool, True, {}), None)
    assert caught.value.http_status == 400
    assert caught.value.param == f"tools[0].function.parameters.properties.{name.split('.')[0]}"
    assert f"tool 'f' parameter {name!r}" in str(caught.value) and "</tool_call>" in str(caught.value)
    # optional, the parameter is left out and the call can be written
    loose = {**parameters, "required": []}
    assert takes(model, json_calls_lark(example_hermes(), model[3], [ToolSchema("f", loose, 0)], True, {}),
                 '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')


def test_a_required_value_behind_nested_refs_holding_the_block_closer_is_a_400_naming_it(model):
    """A required key of a nested model (itself behind a ``$ref``, recursive as pydantic writes a
    linked list) whose const, behind another ``$ref``, holds the closer: named, not llguidance's 400."""
    parameters = {"type": "object", "properties": {"o": {"$ref": "#/$defs/O"}}, "required": ["o"], "$defs": {
        "O": {"type": "object", "properties": {"b": {"$ref": "#/$defs/M"}, "next": {"$ref": "#/$defs/O"}},
              "required": ["b"]}, "M": {"const": "</tool_call>"}}}
    with pytest.raises(GrammarError) as caught:
        model[2].compile_lark(json_calls_lark(example_hermes(), model[3], [ToolSchema("f", parameters, 0)], True, {}),
                              None)
    assert caught.value.param == "tools[0].function.parameters.properties.o"
    assert "tool 'f' parameter 'o.b'" in str(caught.value) and "</tool_call>" in str(caught.value)


def test_an_optional_value_behind_a_ref_holding_the_block_closer_leaves_the_call_writable(model):
    """Each value of the referenced enum holds the closer, so no string can be written there; the
    property is optional (or an array's items, which may stay empty), and the call can be written
    without it: the grammar did not compile at all (a 400 for a valid request)."""
    parameters = {"type": "object", "properties": {
        "m": {"$ref": "#/$defs/M"}, "l": {"type": "array", "items": {"$ref": "#/$defs/M"}}, "n": {"type": "integer"}},
        "$defs": {"M": {"enum": ["</tool_call>", "x</tool_call>"]}}}
    lark = json_calls_lark(example_hermes(), model[3], [ToolSchema("f", parameters, 0)], True, {})
    assert takes(model, lark, '<tool_call>\n{"name": "f", "arguments": {"l":[],"n":1}}\n</tool_call>')
    assert not takes(model, lark, '<tool_call>\n{"name": "f", "arguments": {"m":"x"}}\n</tool_call>')


def test_a_clients_own_empty_enum_is_not_blamed_on_the_block_closer(model):
    """A required ``enum: []`` the client wrote is unsatisfiable of itself: the 400 must not say its
    values hold the closer (the closer check once named it so)."""
    parameters = {"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}
    with pytest.raises(GrammarError) as caught:
        model[2].compile_lark(json_calls_lark(example_hermes(), model[3], [ToolSchema("f", parameters, 0)], True, {}),
                              None)
    assert caught.value.http_status == 400 and "</tool_call>" not in str(caught.value)

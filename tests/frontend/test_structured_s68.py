"""Structured-output options and limits that held in one place and not another (session 68).

- A tool's ``x-guidance`` ``whitespace_flexible`` shaped its arguments in
  JSON-call syntaxes (`grammar_json_calls.arguments_schema`) but not in tag syntaxes, whose JSON
  parameter values took only the server's options (`grammar_tools.CallGrammar`): a Qwen Coder call
  could not write ``{ "k" : 1 }`` however the tool asked. The parsers read a tag value's JSON with
  JSON's own whitespace rules, so the option now applies there too.
- llguidance writes each declared property once but may write an undeclared key twice
  (``{"k": 1, "k": 2}``), counting it twice toward ``minProperties``; a JSON parser reads one key.
  A ``minProperties`` that only such keys could meet is a 400 naming it (`grammar_shapes`).
- A raw string enum of thousands of values (one parser alternative each) passed the check and met
  llguidance's items-per-row limit at the value in every forced call; it is one lexeme now.
- A top-level ``anyOf``/``oneOf``/``allOf`` in a tag syntax was dropped (forced calls wrote ``{}``
  against an ``anyOf`` of objects each requiring a key); it is a 400 naming the tool.
- Flexible whitespace hid a recursive schema whose every output is endless from the check (nothing
  was forced); the check probes such a schema compact too.

Every case drives a real matcher token by token; none needs a model.
"""

from __future__ import annotations

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.parsers import TokenDelimiters
from helios.frontend.preparation.prompt import ReasoningState
from helios.frontend.session import FrontendModel
from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, parse_response_format
from helios.frontend.structured.grammar_frames import frames_lark
from helios.frontend.structured.grammar_lark import Speller
from helios.frontend.structured.grammar_tools import AnswerKind, CallPolicy, TagEnvelope, ToolSchema, tag_tool_lark
from helios.frontend.parsers.start import FramePosition, FrameStart

from .parsers.conftest import small_bpe
from .served import served_contract
from .test_grammar_tools import XTML_TEMPLATE, Served, xtml_frontend
from .test_schema_fuzz import call_arguments, forced, xtml_call

EOS_TEXT = "<|endoftext|>"
OBJECT_VALUE = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
SPACED, COMPACT = '{ "k" : 1 }', '{"k":1}'
DSML = "｜DSML｜"
CALLS = {  # (output syntax, one call of f writing the parameter "o" as `value`)
    "qwen": (S.OutputSyntax(S.ReasoningSyntaxKind.NONE, S.ToolSyntaxKind.QWEN_CODER_FUNCTIONS,
                            tools=S.example_qwen_coder()),
             "<tool_call>\n<function=f>\n<parameter=o>\n{}\n</parameter>\n</function>\n</tool_call>"),
    "glm": (S.OutputSyntax(S.ReasoningSyntaxKind.NONE, S.ToolSyntaxKind.GLM_ARGUMENTS,
                           tools=S.example_glm_arguments()),
            "<tool_call>f\n<arg_key>o</arg_key>\n<arg_value>{}</arg_value>\n</tool_call>"),
    "dsml": (S.OutputSyntax(S.ReasoningSyntaxKind.NONE, S.ToolSyntaxKind.DSML, tools=S.example_dsml()),
             f'<{DSML}function_calls>\n<{DSML}invoke name="f">\n<{DSML}parameter name="o" string="false">{{}}'
             f'</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}function_calls>'),
    "xtml": (S.OutputSyntax(S.ReasoningSyntaxKind.NONE, S.ToolSyntaxKind.XTML, tools=S.example_xtml()),
             xtml_call({"o": "{}"})),
}


@pytest.fixture(scope="module")
def model():
    """A small tokenizer and its compiler with the server's default JSON options (compact JSON)."""
    tokenizer = small_bpe([EOS_TEXT, "<|start|>", "<|message|>", "<|eom|>"])
    eos = tokenizer.token_to_id(EOS_TEXT)
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])
    speller = Speller.from_tokenizer(tokenizer, compiler.is_special_token, TokenDelimiters())
    return tokenizer, eos, compiler, speller


def takes(model, matcher, text: str) -> bool:
    """Whether `matcher` takes `text` (its own tokens) and then its end (EOS)."""
    tokenizer, eos = model[0], model[1]
    ids = tokenizer.encode(text, add_special_tokens=False).ids + [eos]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_stopped


def tool_with(options: dict | None, value: dict = OBJECT_VALUE) -> ToolSchema:
    parameters = {"type": "object", "properties": {"o": value}, "required": ["o"]}
    return ToolSchema("f", parameters if options is None else {**parameters, "x-guidance": options})


def tag_matcher(model, syntax, tool: ToolSchema):
    _, _, compiler, speller = model
    policy = CallPolicy((tool,), AnswerKind.NONE, single_call=True)
    lark = tag_tool_lark(syntax, speller, TagEnvelope(ReasoningState.NO_REASONING, policy), compiler.json_options)
    return compiler.compile_lark(lark, None)


# -- a tool's x-guidance in tag syntaxes -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_tools_whitespace_flexible_shapes_its_json_values_in_tag_syntaxes(model, name):
    """The defect: each syntax here refused the spaced value whatever the tool's option said."""
    syntax, call = CALLS[name]
    spaced, compact = call.replace("{}", SPACED), call.replace("{}", COMPACT)
    flexible = tool_with({"whitespace_flexible": True})
    assert takes(model, tag_matcher(model, syntax, flexible), spaced)
    assert takes(model, tag_matcher(model, syntax, flexible), compact)
    for tool in (tool_with(None), tool_with({"whitespace_flexible": False})):  # compact, the server's default
        assert not takes(model, tag_matcher(model, syntax, tool), spaced)
        assert takes(model, tag_matcher(model, syntax, tool), compact)


def test_a_tools_options_stay_its_own_beside_other_tools(model):
    syntax, call = CALLS["qwen"]
    other = ToolSchema("g", {"type": "object", "properties": {"o": OBJECT_VALUE}, "required": ["o"]})
    _, _, compiler, speller = model
    policy = CallPolicy((tool_with({"whitespace_flexible": True}), other), AnswerKind.NONE, single_call=True)
    lark = tag_tool_lark(syntax, speller, TagEnvelope(ReasoningState.NO_REASONING, policy), compiler.json_options)
    assert takes(model, compiler.compile_lark(lark, None), call.replace("{}", SPACED))
    assert not takes(model, compiler.compile_lark(lark, None), call.replace("{}", SPACED).replace("=f>", "=g>"))


def test_a_tools_whitespace_flexible_shapes_its_atem_values(model):
    _, _, compiler, speller = model
    policy = CallPolicy((tool_with({"whitespace_flexible": True}),), AnswerKind.NONE, single_call=True)
    start = FrameStart(FramePosition.BOUNDARY)
    lark = frames_lark(S.example_recipients(), speller, start, policy, AnswerKind.NONE, compiler.json_options)
    invoke = ('<|start|>assistant to=functions<|message|><atem:function_calls>\n<atem:invoke name="f">\n'
              f'<atem:parameter name="o">{SPACED}</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')
    assert takes(model, compiler.compile_lark(lark, None), invoke)


def test_a_spaced_tag_value_parses_back_to_the_arguments():
    """End to end through a served XTML model with the server's default options: the prepared
    request's grammar takes the spaced value and the parser reads the object back."""
    tokenizer = small_bpe([EOS_TEXT])
    eos = tokenizer.token_to_id(EOS_TEXT)
    contract = served_contract(tokenizer.get_vocab_size(), xtml_frontend(), [eos])
    served = Served(FrontendModel.from_contract(contract, tokenizer, XTML_TEMPLATE), tokenizer, eos, (), {})
    parameters = {"type": "object", "properties": {"o": OBJECT_VALUE}, "required": ["o"]}
    flexible = forced(served, {**parameters, "x-guidance": {"whitespace_flexible": True}})
    assert call_arguments(served, flexible, xtml_call({"o": '{\n "k" : 1 }'})) == {"o": {"k": 1}}
    assert call_arguments(served, forced(served, parameters), xtml_call({"o": SPACED})) is None


# -- undeclared keys written twice ---------------------------------------------------------------------


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_llguidance_writes_an_undeclared_key_twice_but_a_declared_one_once(model):
    """Why `distinct_keys_error` exists: the matcher takes a repeated undeclared key (so a count of
    keys is a count of writes), never a repeated declared one."""
    compiler = model[2]
    open_object = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert takes(model, compiler.compile(parse_response_format(json_schema(open_object))), '{"b":1,"b":2}')
    assert not takes(model, compiler.compile(parse_response_format(json_schema(open_object))), '{"a":1,"a":2}')


@pytest.mark.parametrize("schema, where", [
    ({"type": "object", "minProperties": 2}, ""),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 3}, ""),
    ({"type": "object", "patternProperties": {"^k": {"type": "integer"}}, "additionalProperties": False,
      "minProperties": 2}, ""),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "minProperties": 3}, ""),
    ({"type": "object", "properties": {"o": {"type": "object", "minProperties": 2}}}, " at /properties/o"),
])
def test_a_min_properties_only_repeatable_keys_could_meet_is_a_400(model, schema, where):
    """The defect: ``{"type": "object", "minProperties": 2}`` took ``{"b":1,"b":2}``, one key to
    any JSON parser, as two; so did a tool's arguments (which the parsers read as one key)."""
    with pytest.raises(GrammarError, match=f"minProperties \\d+{where}: an object that takes undeclared keys") as info:
        model[2].compile(parse_response_format(json_schema(schema)))
    assert info.value.http_status == 400
    tool = ToolSchema("f", {"type": "object", "properties": {"o": schema}, "required": ["o"]}, index=0)
    assert model[2].first_failure([tool.parameters_request()]) is not None


@pytest.mark.parametrize("schema, good", [
    ({"type": "object", "minProperties": 1}, '{"b":1}'),  # one undeclared key is distinct
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "minProperties": 2},
     '{"a":1,"b":2}'),
    ({"type": "object", "additionalProperties": False, "minProperties": 0}, "{}"),
])
def test_a_min_properties_distinct_keys_meet_still_compiles(model, schema, good):
    assert takes(model, model[2].compile(parse_response_format(json_schema(schema))), good)


def test_a_tag_syntaxs_parameters_keep_a_top_level_min_properties(model):
    """A tag syntax writes each declared parameter once: a tool's top-level ``minProperties`` cannot
    be met by a repeated key there, and its check refused tools that compiled before; as one JSON
    value (JSON calls, harmony) the arguments may repeat an undeclared key, so it is refused there."""
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in ("city", "zip", "country")},
              "minProperties": 2}
    tool = ToolSchema("f", schema, index=0)
    assert model[2].first_failure([tool.parameters_request(one_value=False)]) is None
    assert model[2].first_failure([tool.parameters_request()]) is not None
    nested = ToolSchema("f", {"type": "object", "properties": {"o": {"type": "object", "minProperties": 2}}}, index=0)
    assert model[2].first_failure([nested.parameters_request(one_value=False)]) is not None  # a JSON value inside


# -- raw string enums of thousands of values -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_raw_string_enum_of_thousands_of_values_is_written(model, name):
    """The defect: a forced call of a 3000-value enum compiled and passed the check, then every output
    met llguidance's items-per-row limit (2000) at the parameter (one parser alternative a value)."""
    syntax, call = CALLS[name]
    values = [f"v{i}" for i in range(3000)]
    tool = tool_with(None, {"enum": values})
    if name == "dsml":  # a plain string parameter is raw text there under string="true"
        call = call.replace('string="false"', 'string="true"')
    for value, written in (("v2999", True), ("v29", True), ("v3000", False), ("v", False)):
        assert takes(model, tag_matcher(model, syntax, tool), call.replace("{}", value)) is written, value


def test_a_raw_string_enum_before_a_closer_token_takes_the_empty_value(model):
    """Before a closer generated as its token (no text ends the lexeme) the empty value is the
    value's absence; a value that is a prefix of another is still one of them."""
    tokenizer = small_bpe([EOS_TEXT, "</arg_value>"])
    eos = tokenizer.token_to_id(EOS_TEXT)
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])
    speller = Speller.from_tokenizer(tokenizer, compiler.is_special_token, TokenDelimiters())
    syntax, call = CALLS["glm"]
    tool = tool_with(None, {"enum": ["", "a", "ab"]})
    policy = CallPolicy((tool,), AnswerKind.NONE, single_call=True)
    lark = tag_tool_lark(syntax, speller, TagEnvelope(ReasoningState.NO_REASONING, policy), compiler.json_options)
    small = (tokenizer, eos, compiler, speller)
    for value, written in (("", True), ("a", True), ("ab", True), ("b", False), ("abc", False)):
        assert takes(small, compiler.compile_lark(lark, None), call.replace("{}", value)) is written, value


# -- top-level anyOf / oneOf / allOf in tag syntaxes -------------------------------------------------------

COMBINED = {  # each a forced call in a tag syntax wrote `{}`, which the schema refuses
    "anyOf": {"type": "object", "anyOf": [
        {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    "oneOf": {"type": "object", "properties": {"a": {"type": "integer"}}, "oneOf": [{"required": ["a"]}]},
    "allOf": {"$defs": {"p": {"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}},
                                                           "required": ["a"]}]}},
              "$ref": "#/$defs/p"},
}


@pytest.mark.parametrize("keyword", sorted(COMBINED))
def test_a_top_level_combinator_a_tag_syntax_cannot_hold_is_a_400(model, keyword):
    tool = ToolSchema("f", COMBINED[keyword], index=0)
    for syntax, _ in CALLS.values():
        with pytest.raises(GrammarError, match=f"a top-level {keyword} cannot be held") as info:
            tag_matcher(model, syntax, tool)
        assert info.value.http_status == 400 and info.value.param == "tools[0].function.parameters"


@pytest.mark.parametrize("answer", [AnswerKind.FREE, AnswerKind.NONE])
def test_a_top_level_combinator_in_a_tool_the_model_may_choose_still_compiles(model, answer):
    """Only the one tool an output must call is refused: a tool beside others (``required`` of
    several, or ``auto`` with ``parallel_tool_calls: false``) is left as it was (the combinator out)
    rather than failing a request that may never call it."""
    _, _, compiler, speller = model
    other = ToolSchema("g", {"type": "object", "properties": {"x": {"type": "integer"}}}, index=1)
    for syntax, _ in CALLS.values():
        policy = CallPolicy((ToolSchema("f", COMBINED["anyOf"], index=0), other), answer, single_call=True)
        envelope = TagEnvelope(ReasoningState.NO_REASONING, policy)
        assert compiler.compile_lark(tag_tool_lark(syntax, speller, envelope, compiler.json_options), None)


def test_combinators_below_the_top_level_are_still_held(model):
    syntax, call = CALLS["qwen"]
    tool = tool_with(None, {"anyOf": [OBJECT_VALUE, {"type": "array", "items": {"type": "integer"}}]})
    assert takes(model, tag_matcher(model, syntax, tool), call.replace("{}", "[1,2]"))
    assert not takes(model, tag_matcher(model, syntax, tool), call.replace("{}", "{}"))


# -- whitespace no longer hides a schema whose every output is endless ------------------------------------

ENDLESS = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
           "$ref": "#/$defs/n"}  # {"c": {"c": ...}}: no output completes
TREE = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}


def test_an_endless_schema_is_a_400_with_flexible_whitespace_too(model):
    """Compact, the check found the forced text that never ends; with whitespace between tokens
    (the schema's ``whitespace_flexible``, a tool's, or the server's whitespace defaults) nothing is
    forced and the schema passed, so every output ran to the length limit as JSON never completed."""
    tokenizer, eos, compiler, _ = model
    spaced = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos],
                                            json_defaults={"whitespace_pattern": "[ \\n]{0,2}"})
    flexible = {**ENDLESS, "x-guidance": {"whitespace_flexible": True}}
    for each, schema in ((compiler, ENDLESS), (compiler, flexible), (spaced, ENDLESS)):
        with pytest.raises(GrammarError, match="never ends") as info:
            each.compile(parse_response_format(json_schema(schema)))
        assert info.value.http_status == 400
    tool = ToolSchema("f", {"type": "object", "properties": {"t": {"$ref": "#/$defs/n"}}, "required": ["t"],
                            "$defs": ENDLESS["$defs"], "x-guidance": {"whitespace_flexible": True}}, index=0)
    assert "never ends" in compiler.first_failure([tool.parameters_request()])[1]


def test_a_recursive_schema_with_a_way_out_still_compiles_with_flexible_whitespace(model):
    compiler = model[2]
    flexible = {**TREE, "x-guidance": {"whitespace_flexible": True}}
    assert takes(model, compiler.compile(parse_response_format(json_schema(flexible))), '{ "c" : { } }')

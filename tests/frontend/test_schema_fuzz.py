"""Structured output against an independent JSON Schema validator (`jsonschema`, Draft 2020-12).

Random schemas from the subset Helios serves (`support.schema_fuzz`) go through the answer
grammar exactly as a ``response_format`` does (`parse_response_format`, then the compiler with its
production JSON options: compact JSON). Each is either refused with a `GrammarError` naming a
keyword llguidance does not implement, or every output a sampler writes under its masks parses as
JSON that the reference accepts; the sampler draws random allowed tokens (a random model at
temperature 1 without its preferences), leaning on closing punctuation so outputs end. An output
cut by its token limit is the request's ``length`` finish and is not judged. The other direction:
random valid instances, written compactly as llguidance writes them (declared properties first,
in order; no escapes a raw character can spell), are accepted by the grammar, so it is no narrower
than the schema. Tool parameters go through the tool-call grammar of a tag syntax (Qwen's
``<parameter=...>``) and its own parser, and the parsed arguments must satisfy the parameters schema.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.parsers.values import STRING_ONLY, schema_kinds
from helios.frontend.structured.grammar_values import NULLABLE_STRING
from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, parse_response_format
from helios.frontend.structured.grammar_tools import is_markup_name
from helios.server.schemas import ChatCompletionRequest
from support.schema_fuzz import (NoInstance, SchemaWriter, compact, random_instance, random_schema, validate,
                                 with_unsupported)
from support.sweeps import swept

from .served import run_output

EOS = 1  # <｜end▁of▁sentence｜>
NUM_SCHEMAS = 20
SAMPLES_PER_SCHEMA = 3
MAX_TOKENS = 160
# Random tools forced per syntax: 8 by default (each syntax's writer and parser run on every draw),
# 16 with HELIOS_SCHEMA_FUZZ_SWEEP=1 (more random schemas through the same paths).
FORCED_TOOLS = 16 if swept("HELIOS_SCHEMA_FUZZ_SWEEP") else 8
# The served tests through the tiny core: by default 3 random schemas (two answered, one refused for an
# unsupported keyword) and 3 forced tools; HELIOS_SCHEMA_FUZZ_SWEEP=1 serves 6 of each, as before (the
# same draws first). test_outputs_under_random_schemas_validate and test_forced_call_arguments_validate
# take the grammar and parser paths of many more random schemas by default.
SERVED_SCHEMAS = 6 if swept("HELIOS_SCHEMA_FUZZ_SWEEP") else 3
SERVED_TOOLS = 6 if swept("HELIOS_SCHEMA_FUZZ_SWEEP") else 3


@pytest.fixture(scope="module")
def compiler(deepseek_tokenizer):
    return GrammarCompiler.from_tokenizer(deepseek_tokenizer, vocab_size=deepseek_tokenizer.get_vocab_size(),
                                          eos_token_ids=[EOS])


@pytest.fixture(scope="module")
def closing_ids(deepseek_tokenizer):
    """Tokens that end values: quotes, brackets, separators, digits and EOS."""
    ids = {deepseek_tokenizer.token_to_id(text) for text in ('"', "}", "]", ",", "0", "1", "7", "null", "true")}
    return np.array(sorted(ids - {None} | {EOS}))


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "fuzz", "schema": schema}}


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def sample(matcher, rng: np.random.Generator, vocab_size: int, closing: np.ndarray) -> list[int] | None:
    """Random allowed tokens up to EOS (its ids without EOS), or None when MAX_TOKENS ran out first."""
    ids = []
    while len(ids) < MAX_TOKENS:
        allowed = allowed_ids(matcher.bitmask(), vocab_size)
        assert allowed.size, "a mask that allows nothing"
        preferred = np.intersect1d(allowed, closing, assume_unique=True)
        pool = preferred if preferred.size and rng.random() < 0.5 else allowed
        token_id = int(rng.choice(pool))
        assert matcher.consume_token(token_id), matcher.error
        if token_id == EOS:
            return ids
        ids.append(token_id)
    return None


def accepts(matcher, tokenizer, text: str) -> bool:
    """Whether the grammar (a fork of ``matcher``) takes ``text`` whole, then EOS."""
    probe = matcher.fork()
    return all(probe.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False).ids) \
        and probe.is_accepting


def schemas(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    return [random_schema(rng) for _ in range(count)]


def test_outputs_under_random_schemas_validate(compiler, deepseek_tokenizer, closing_ids):
    vocab_size = deepseek_tokenizer.get_vocab_size()
    rng = np.random.default_rng(20261205)
    finished = 0
    for index, schema in enumerate(schemas(1, NUM_SCHEMAS)):
        request = parse_response_format(response_format(schema))
        try:
            matcher = compiler.compile(request)
        except GrammarError as error:
            raise AssertionError(f"schema {index} refused: {error}: {json.dumps(schema)}") from None
        for _ in range(SAMPLES_PER_SCHEMA):
            ids = sample(matcher.fork(), rng, vocab_size, closing_ids)
            if ids is None:
                continue  # finish_reason "length": an incomplete document is allowed
            text = deepseek_tokenizer.decode(ids, skip_special_tokens=False)
            value = json.loads(text)
            assert validate(value, schema) == [], (text, json.dumps(schema, ensure_ascii=False))
            finished += 1
    assert finished >= NUM_SCHEMAS * SAMPLES_PER_SCHEMA // 2  # most outputs ended: the check judged them


def test_the_grammar_accepts_every_valid_instance(compiler, deepseek_tokenizer):
    rng = random.Random(7)
    judged = 0
    for index, schema in enumerate(schemas(2, NUM_SCHEMAS)):
        matcher = compiler.compile(parse_response_format(response_format(schema)))
        for _ in range(4):
            try:
                value = random_instance(rng, schema)
            except NoInstance:
                continue
            assert validate(value, schema) == []
            spellings = [compact(value, decimals) for decimals in (0, 2)]
            assert any(accepts(matcher, deepseek_tokenizer, text) for text in spellings), (
                f"schema {index}: {spellings[0]} refused: {json.dumps(schema, ensure_ascii=False)}")
            judged += 1
    assert judged >= NUM_SCHEMAS * 2


def test_a_keyword_llguidance_lacks_is_refused_by_name(compiler):
    rng = random.Random(3)
    for schema in schemas(3, 20):
        unsupported, keyword = with_unsupported(rng, schema)
        with pytest.raises(GrammarError) as info:
            compiler.compile(parse_response_format(response_format(unsupported)))
        assert keyword in str(info.value)


# -- strict tools: the arguments a forced call writes satisfy the parameters schema ------------------

TOOL_SYNTAXES = ["qwen", "dsml", "xtml"]


@pytest.fixture(scope="module")
def tool_models(qwen_tokenizer, deepseek_tokenizer):
    from .test_grammar_tools import served_models

    return served_models(qwen_tokenizer, deepseek_tokenizer, TOOL_SYNTAXES)


def tool_output(matcher, served, rng: np.random.Generator) -> list[int] | None:
    """Random allowed tokens or (probability 1/2) a guide, up to EOS; None when MAX_TOOL_TOKENS ran out."""
    from .test_grammar_tools import sample_until_eos

    ids, ended = sample_until_eos(matcher, served, rng, MAX_TOOL_TOKENS)
    return ids if ended else None


MAX_TOOL_TOKENS = 300


def raw_text_schema(parameters: dict) -> dict:
    """The parameters as tag syntaxes hold them: a plain (or nullable) string parameter is raw text,
    held to its ``minLength``, ``maxLength`` and ``pattern`` but not ``format`` (README)."""
    document = SchemaDocument(parameters, "parameters", "tools")
    properties = {name: without_formats(sub, parameters.get("$defs", {}))
                  if schema_kinds(sub, document) in (STRING_ONLY, NULLABLE_STRING, frozenset()) else sub
                  for name, sub in parameters.get("properties", {}).items()}
    return {**parameters, "properties": properties}


def without_formats(schema, defs: dict, depth: int = 0):
    """``schema`` with its ``$defs`` refs inlined (a few levels) and no ``format`` keyword."""
    if isinstance(schema, list):
        return [without_formats(item, defs, depth) for item in schema]
    if not isinstance(schema, dict) or depth > 8:
        return schema
    if "$ref" in schema:
        target = defs[schema["$ref"].removeprefix("#/$defs/")]
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return without_formats({**target, **rest}, defs, depth + 1)
    return {key: without_formats(value, defs, depth + 1) if key in ("allOf", "anyOf", "oneOf") else value
            for key, value in schema.items() if key != "format"}


@pytest.mark.parametrize("syntax", [*TOOL_SYNTAXES, "hermes"])
def test_forced_call_arguments_validate(request, syntax):
    if syntax == "hermes":  # a JSON-call syntax
        from .test_grammar_tools import Served, closers_for

        _, tokenizer, frontend = request.getfixturevalue("hermes")
        eos = tokenizer.token_to_id("<|im_end|>")
        served = Served(frontend, tokenizer, eos, closers_for(frontend, tokenizer, eos),
                        {"chat_template_kwargs": {"enable_thinking": False}})
    else:
        served = request.getfixturevalue("tool_models")[syntax]
    tools = FORCED_TOOLS
    assert forced_calls(served, random.Random(len(syntax)), np.random.default_rng(11), tools) >= tools * 3 // 4


def is_documented_refusal(parameters: dict, error: GrammarError) -> bool:
    """A required parameter whose name is no markup name, or a raw string parameter whose anyOf
    alternatives carry different bounds (patterns, or length ranges with a gap between them)."""
    unwritable = [key for key in parameters.get("required", ()) if not is_markup_name(key)]
    if unwritable:
        return error.param == f"tools[0].function.parameters.properties.{unwritable[0]}"
    prefix = "tools[0].function.parameters.properties."
    name = (error.param or "").removeprefix(prefix)
    schema = json.dumps(parameters["properties"].get(name))
    if "$ref" in schema:  # the anyOf may stand in a definition
        schema += json.dumps(parameters.get("$defs"))
    return "bound the text differently" in str(error) and "anyOf" in schema


def forced_calls(served, writer_rng: random.Random, rng: np.random.Generator, count: int) -> int:
    """Forces calls of ``count`` random tools, three outputs each; the number of outputs judged."""
    called = 0
    for index in range(count):
        writer = SchemaWriter(writer_rng)
        parameters = writer.object(1)
        if writer.defs:
            parameters["$defs"] = writer.defs
        body = {"model": served.model.served_id, "messages": [{"role": "user", "content": "go"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters, "strict": True}}],
                "tool_choice": "required", **served.kwargs}
        try:
            prepared = served.model.prepare_chat(ChatCompletionRequest.model_validate(body))
        except GrammarError as error:  # only where the README says a tag syntax cannot write the schema
            assert is_documented_refusal(parameters, error), f"tool {index} refused: {error}: {json.dumps(parameters)}"
            continue
        for _ in range(3):
            ids = tool_output(prepared.grammar.fork(), served, rng)
            if ids is None:
                continue
            _, final = run_output(prepared, ids)
            assert final.result.errors == () and final.result.tool_calls, final.result
            for call in final.result.tool_calls:
                arguments = json.loads(call.arguments)
                assert validate(arguments, raw_text_schema(parameters)) == [], (
                    call.arguments, json.dumps(parameters, ensure_ascii=False))
            called += 1
    return called


# -- defects the fuzz found, pinned ----------------------------------------------------------------


def forced(served, parameters: dict, tool_choice: str = "required"):
    body = {"model": served.model.served_id, "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            "tool_choice": tool_choice, "chat_template_kwargs": {"enable_thinking": False}}
    return served.model.prepare_chat(ChatCompletionRequest.model_validate(body))


def qwen_call(arguments: dict[str, str]) -> str:
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function=f>\n{parameters}</function>\n</tool_call>"


def call_arguments(served, prepared, text: str) -> dict | None:
    """The parsed arguments of the one call ``text`` writes, or None when the grammar refuses it."""
    ids = served.tokenizer.encode(text, add_special_tokens=False).ids
    probe = prepared.grammar.fork()
    if not all(probe.consume_token(t) for t in ids):
        return None
    _, final = run_output(prepared, ids + [served.eos])
    (call,) = final.result.tool_calls
    return json.loads(call.arguments)


@pytest.mark.parametrize("parameters, param", [
    ({"type": "object", "properties": {"a<b": {"type": "string"}}, "required": ["a<b"]},
     "tools[0].function.parameters.properties.a<b"),
    # the name is read up to the tag's ">": 'a>b' was written and read back as 'a' with 'b>...' in its value
    ({"type": "object", "properties": {"a>b": {"type": "string"}}, "required": ["a>b"]},
     "tools[0].function.parameters.properties.a>b"),
    ({"type": "object", "properties": {"a b ": {"type": "integer"}}, "required": ["a b "]},
     "tools[0].function.parameters.properties.a b "),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
     "tools[0].function.parameters.required"),
])
def test_a_required_parameter_a_tag_syntax_cannot_write_is_a_400(tool_models, parameters, param):
    """A forced call used to leave such a parameter out, so its arguments missed a required key."""
    with pytest.raises(GrammarError) as info:
        forced(tool_models["qwen"], parameters)
    assert info.value.http_status == 400 and info.value.param == param
    assert "is required but cannot be written" in str(info.value)


def test_an_optional_parameter_a_tag_syntax_cannot_write_is_left_out(tool_models):
    served = tool_models["qwen"]
    prepared = forced(served, {"type": "object", "properties": {"a<b": {"type": "string"}, "a": {"type": "integer"}}})
    assert call_arguments(served, prepared, qwen_call({"a": "3"})) == {"a": 3}


def test_a_parameter_name_with_quotes_or_line_breaks_is_written_and_read(tool_models):
    """vLLM's qwen3_coder parser reads a parameter name up to the tag's ``>``, and the template writes
    it verbatim: such a required parameter was a 400, an optional one left out, and one the model wrote
    was lost with its value."""
    served = tool_models["qwen"]
    names = ['say "hi"', "two\nlines"]
    parameters = {"type": "object", "properties": {name: {"type": "string"} for name in names}, "required": names}
    prepared = forced(served, parameters)
    text = qwen_call({names[0]: "x", names[1]: "y"})
    assert call_arguments(served, prepared, text) == {names[0]: "x", names[1]: "y"}
    # unforced, a value whose closer the model left out ends at the next such parameter tag
    unclosed = text.replace("x\n</parameter>\n", "x\n", 1)
    ids = served.tokenizer.encode(unclosed, add_special_tokens=False).ids
    _, final = run_output(forced(served, parameters, "auto"), ids + [served.eos])
    (call,) = final.result.tool_calls
    assert json.loads(call.arguments) == {names[0]: "x", names[1]: "y"}


def test_declared_properties_beside_additional_properties_keep_their_own_schema(tool_models):
    """The undeclared values' schema used to apply to the declared keys too (patternProperties do):
    a string property beside integer extras could not be written, and a required one made the tool a 400."""
    served = tool_models["qwen"]
    inner = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"],
             "additionalProperties": {"type": "integer"}}
    prepared = forced(served, {"type": "object", "properties": {"o": inner}, "required": ["o"]})
    assert call_arguments(served, prepared, qwen_call({"o": '{"s":"x"}'})) == {"o": {"s": "x"}}
    assert call_arguments(served, prepared, qwen_call({"o": '{"s":3}'})) is None


RAW_STRINGS = {  # a raw string parameter's schema -> (text it takes, text it refuses)
    "allOf maxLength": ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, "ab", "abc"),
    "allOf enum": ({"allOf": [{"type": "string"}, {"enum": ["a", "b"]}]}, "b", "c"),
    "anyOf consts": ({"anyOf": [{"const": "a"}, {"const": "b"}]}, "a", "c"),
    "oneOf enums": ({"oneOf": [{"enum": ["x"]}, {"enum": ["y", "z"]}]}, "z", "w"),
    "$ref then allOf pattern": ({"$ref": "#/$defs/s", "allOf": [{"pattern": "^[a-z]+$"}]}, "abc", "ab1"),
    "two patterns": ({"type": "string", "pattern": "^a", "allOf": [{"pattern": "z$"}]}, "abz", "ab"),
    "enum within maxLength": ({"type": "string", "enum": ["ok", "too long"], "maxLength": 3}, "ok", "too long"),
    "anyOf one bound": ({"anyOf": [{"type": "string", "maxLength": 2}, {"const": "x", "maxLength": 2}]}, "ab", "abc"),
    "anyOf length ranges": ({"anyOf": [{"type": "string", "minLength": 1, "maxLength": 3},
                                       {"type": "string", "minLength": 3, "maxLength": 5}]}, "abcde", "abcdef"),
}


@pytest.mark.parametrize("case", list(RAW_STRINGS))
def test_raw_string_bounds_hold_wherever_the_schema_gives_them(tool_models, case):
    """Bounds and values in allOf/anyOf/oneOf branches or behind a $ref used to be dropped: the raw
    text was free."""
    schema, good, bad = RAW_STRINGS[case]
    served = tool_models["qwen"]
    parameters = {"type": "object", "properties": {"s": schema}, "required": ["s"],
                  "$defs": {"s": {"type": "string", "maxLength": 5}}}
    prepared = forced(served, parameters)
    assert call_arguments(served, prepared, qwen_call({"s": good})) == {"s": good}
    assert call_arguments(served, prepared, qwen_call({"s": bad})) is None
    assert validate({"s": good}, parameters) == [] and validate({"s": bad}, parameters) != []


@pytest.mark.parametrize("schema, words", [
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "pattern": "^z+$"}]}, "bound the text differently"),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "minLength": 4}]}, "bound the text differently"),
    ({"type": "string", "enum": ["long"], "maxLength": 2}, "none of its enum/const values"),
])
def test_raw_string_constraints_no_raw_text_can_hold_are_a_400(tool_models, schema, words):
    with pytest.raises(GrammarError) as info:
        forced(tool_models["qwen"], {"type": "object", "properties": {"s": schema}})
    assert info.value.param == "tools[0].function.parameters.properties.s" and words in str(info.value)


def xtml_call(arguments: dict[str, str]) -> str:
    parameters = "".join(f'<xtml:arg name="{key}">{value}</xtml:arg>\n' for key, value in arguments.items())
    return f'<xtml:calls>\n<xtml:call name="f">\n{parameters}</xtml:call>\n</xtml:calls>'


@pytest.mark.parametrize("items, good, bad", [
    ({"type": "string", "minLength": 3}, '["abc"]', '["&amp;K"]'),  # reads "&K": 2 characters
    ({"type": "string", "minLength": 2, "pattern": "^.*$"}, '["ab"]', '["&lt;"]'),  # reads "<"
    ({"type": ["string", "null"], "minLength": 4}, '["abcd", null]', '["&gt;"]'),
])
def test_escaped_json_strings_are_checked_as_the_parser_reads_them(tool_models, items, good, bad):
    """XTML's JSON values are XML-escaped text: llguidance used to count and match an entity as
    written, while the parser decodes it, so a bounded string could read shorter than its minLength."""
    served = tool_models["xtml"]
    parameters = {"type": "object", "properties": {"o": {"type": "array", "items": items}}, "required": ["o"]}
    prepared = forced(served, parameters)
    assert call_arguments(served, prepared, xtml_call({"o": good})) == {"o": json.loads(good)}
    assert call_arguments(served, prepared, xtml_call({"o": bad})) is None


# -- end to end: the tiny served core at temperature 1 ---------------------------------------------


@pytest.fixture(scope="module")
def served_app(tmp_path_factory):
    from helios.server.app import create_app
    from support.server_core import served_tiny_core

    with served_tiny_core(tmp_path_factory.getbasetemp(), frontend_workers=2) as served:
        yield create_app(served)


def post_chat(app, body: dict, max_tokens: int = 96) -> dict:
    import asyncio

    import httpx
    from support.server_core import SERVED_ID

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            return await client.post("/v1/chat/completions", json={
                "model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0,
                "max_tokens": max_tokens, "chat_template_kwargs": {"enable_thinking": False}, **body})

    response = asyncio.run(scenario())
    return {"status": response.status_code, **response.json()}


def test_served_json_schema_answers_validate_or_end_by_length(served_app):
    """A random model at temperature 1, several seeds: a complete answer validates, an incomplete one
    says finish_reason "length"; a schema with a keyword llguidance lacks is a 400 naming it."""
    rng = random.Random(5)
    judged = 0
    for index, schema in enumerate(schemas(4, SERVED_SCHEMAS)):
        refused, keyword = with_unsupported(rng, schema) if index % 3 == 2 else (None, None)
        if refused is not None:
            body = post_chat(served_app, {"response_format": response_format(refused)})
            assert body["status"] == 400 and body["error"]["param"] == "response_format", body
            assert keyword in body["error"]["message"]
            continue
        for seed in (1, 2, 3):
            body = post_chat(served_app, {"response_format": response_format(schema), "seed": seed})
            assert body["status"] == 200, body
            (choice,) = body["choices"]
            if choice["finish_reason"] == "length":
                continue
            assert choice["finish_reason"] == "stop", choice
            assert validate(json.loads(choice["message"]["content"]), schema) == [], (choice, schema)
            judged += 1
    assert judged >= 4


def test_served_forced_call_arguments_validate(served_app):
    rng = random.Random(8)
    judged = 0
    for _ in range(SERVED_TOOLS):
        writer = SchemaWriter(rng, max_depth=1)
        parameters = writer.object(1)
        parameters["required"] = [key for key in parameters.get("required", ()) if is_markup_name(key)]
        if writer.defs:
            parameters["$defs"] = writer.defs
        tool = {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": True}}
        for seed in (1, 2):
            body = post_chat(served_app, {"tools": [tool], "tool_choice": "required", "seed": seed}, max_tokens=160)
            if body["status"] == 400:  # the README's raw-string limits, named by the parameter
                assert body["error"]["param"].startswith("tools[0].function.parameters.properties."), body
                break
            (choice,) = body["choices"]
            if choice["finish_reason"] == "length":
                continue
            assert choice["finish_reason"] == "tool_calls", choice
            for call in choice["message"]["tool_calls"]:
                arguments = json.loads(call["function"]["arguments"])
                assert validate(arguments, raw_text_schema(parameters)) == [], (call, parameters)
            judged += 1
    assert judged >= 4


@pytest.fixture(scope="module")
def hermes(tmp_path_factory, qwen_tokenizer, deepseek_tokenizer):
    """The Hermes family core's frontend, built from its contract, tokenizer and template as the server
    builds it (test_render_fuzz's way: no weights loaded)."""
    from helios.frontend.session import FrontendModel
    from helios.runtime.loading.model import resource_of_kind
    from support.family_checkpoints import CASES, prepared_family_core

    from .conftest import served_tokenizer

    case = next(case for case in CASES if case.name == "hermes")
    tokenizer, core = prepared_family_core(case, tmp_path_factory.getbasetemp(), qwen_tokenizer, deepseek_tokenizer)
    served = served_tokenizer(core.read_resource(resource_of_kind(core, "TOKENIZER")).decode("utf-8"))
    template = core.read_resource(resource_of_kind(core, "CHAT_TEMPLATE")).decode("utf-8")
    return case.name, tokenizer, FrontendModel.from_contract(core.prepared, served, template)


def test_json_call_arguments_never_spell_the_block_closer(hermes):
    """Hermes finds ``</tool_call>`` as text: a string argument that spelled it in plain-text tokens
    ended the block inside the JSON, and the forced call came back as answer text with a parse error."""
    name, tokenizer, frontend = hermes
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}, "o": {"type": "object"}}, "required": ["s"]}}}
    body = {"model": name, "messages": [{"role": "user", "content": "x"}], "tools": [tool], "tool_choice": "required"}
    prepared = frontend.prepare_chat(ChatCompletionRequest.model_validate(body))

    def call_ids(arguments: str) -> list[int]:  # the arguments one character a token: no special token
        pieces = ['<tool_call>\n{"name": "f", "arguments": ', *arguments, "}\n", "</tool_call>"]
        return [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False).ids]

    def accepts(ids: list[int]) -> bool:
        probe = prepared.grammar.fork()
        return all(probe.consume_token(t) for t in ids)

    good = call_ids('{"s":"a</tool_cal>"}')
    assert accepts(good)
    _, final = run_output(prepared, good)
    assert final.result.errors == () and [call.arguments for call in final.result.tool_calls] == ['{"s": "a</tool_cal>"}']
    assert not accepts(call_ids('{"s":"a</tool_call>b"}'))
    assert not accepts(call_ids('{"s":"","o":{"</tool_call>":1}}'))

"""Local ``$ref``s in tool parameter schemas and ``response_format`` schemas.

The schemas are the ones pydantic 2 writes (``$defs`` plus ``#/$defs/NAME`` refs, a recursive model
as a top-level ref), plus ``definitions``, JSON pointers with ``~0``/``~1`` escapes and anchors.
Unit checks cover `SchemaDocument`, the parsers' kind typing and the grammar's string removal; the
end-to-end checks prepare chat requests on a small XTML model, drive fixed outputs through the
request's grammar and parse them with the request's own output path.
"""

from __future__ import annotations

import json
import re

import pytest

from helios.frontend.structured.grammar import GrammarError, parse_response_format
from helios.frontend.structured.grammar_values import SAFE_JSON, without_strings
from helios.frontend.parsers.schema_refs import MAX_BUNDLED_NODES, SchemaDocument, SchemaRefError
from helios.frontend.parsers.values import ToolRegistry, ValueKind, schema_kinds, typed_value
from helios.frontend.session import FrontendModel
from helios.server.schemas import ChatCompletionRequest

from .parsers.conftest import small_bpe
from .served import JSON_DEFAULTS, ids_of, run_output, served_contract
from .test_grammar_tools import XTML_TEMPLATE, xtml_frontend

LOCATION = {"properties": {"lat": {"title": "Lat", "type": "number"}, "lon": {"title": "Lon", "type": "number"}},
            "required": ["lat", "lon"], "title": "Location", "type": "object", "additionalProperties": False}
NODE = {"properties": {"value": {"type": "integer"}, "children": {"default": [], "items": {"$ref": "#/$defs/Node"},
                                                                  "type": "array"}},
        "required": ["value"], "title": "Node", "type": "object", "additionalProperties": False}
COLOR = {"enum": ["red", "green"], "title": "Color", "type": "string"}
ARGS = {  # pydantic: loc: Location, home: Location | None, tree: Node, color: Color, count through a pointer
    "$defs": {"Location": LOCATION, "Node": NODE, "Color": COLOR},
    "properties": {
        "loc": {"$ref": "#/$defs/Location"},
        "home": {"anyOf": [{"$ref": "#/$defs/Location"}, {"type": "null"}], "default": None},
        "tree": {"$ref": "#/$defs/Node"},
        "color": {"$ref": "#/$defs/Color", "description": "paint"},
        "count": {"$ref": "#/$defs/Node/properties/value"},
    },
    "required": ["loc", "tree", "color", "count"], "title": "Args", "type": "object",
}
TREE = {"$defs": {"Node": NODE}, "$ref": "#/$defs/Node"}  # a recursive model at the top


def tools(parameters: dict, name: str = "f") -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": parameters}}]


# -- SchemaDocument ------------------------------------------------------------------------------------


def test_local_refs_resolve_by_definition_pointer_escape_and_anchor():
    root = {
        "$defs": {"A": {"type": "integer"}, "x~y/z": {"type": "null"}, "A B": {"type": "boolean"}},
        "definitions": {"B": {"type": "string"}},
        "properties": {"a": {"type": "array", "items": {"type": "number"}},
                       "b": {"anyOf": [{"type": "object"}, {"$anchor": "here", "type": "boolean"}]}},
    }
    document = SchemaDocument(root)
    assert document.resolve("#/$defs/A") == {"type": "integer"}
    assert document.resolve("#/definitions/B") == {"type": "string"}
    assert document.resolve("#/properties/a/items") == {"type": "number"}
    assert document.resolve("#/$defs/x~0y~1z") == {"type": "null"}
    assert document.resolve("#/$defs/A%20B") == {"type": "boolean"}
    assert document.resolve("#/properties/b/anyOf/0") == {"type": "object"}
    assert document.resolve("#here") == {"$anchor": "here", "type": "boolean"}
    assert document.resolve("#") is root


@pytest.mark.parametrize("ref, problem", [
    ("http://example.com/schema.json", "not local"),
    ("other.json#/$defs/A", "not local"),
    ("#/$defs/Missing", "does not resolve"),
    ("#/definitions/A", "does not resolve"),
    ("#/properties/a/items/7", "does not resolve"),
    ("#nowhere", "no $anchor"),
    ("#/required", "not a schema"),
])
def test_bad_refs_are_request_errors_naming_the_ref(ref, problem):
    root = {"$defs": {"A": {"type": "integer"}}, "required": ["a"],
            "properties": {"a": {"type": "array", "items": {"type": "string"}}, "b": {"$ref": ref}}}
    with pytest.raises(SchemaRefError, match=re.escape(problem)) as caught:
        SchemaDocument(root, "tool 'f' parameters")
    assert caught.value.http_status == 400
    assert str(caught.value).startswith(f"tool 'f' parameters: $ref {ref!r}")


def test_refs_that_only_lead_back_to_themselves_are_rejected():
    for root in ({"$ref": "#"}, {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}},
                 {"$defs": {"A": {"$ref": "#/$defs/A", "type": "object"}}}):
        with pytest.raises(SchemaRefError, match="refers to itself"):
            SchemaDocument(root)
    with pytest.raises(SchemaRefError, match="not a string"):
        SchemaDocument({"properties": {"a": {"$ref": 3}}})


def test_refs_inside_data_and_property_names_are_not_refs():
    root = {"properties": {"$ref": {"type": "string"}, "enum": {"$ref": "#/$defs/A"}},
            "default": {"$ref": "http://example.com"}, "$defs": {"A": {"type": "integer"}}}
    assert SchemaDocument(root).resolve("#/properties/enum") == {"$ref": "#/$defs/A"}
    with pytest.raises(SchemaRefError, match="Missing"):  # a property named "enum" is still checked
        SchemaDocument({"properties": {"enum": {"$ref": "#/$defs/Missing"}}})


def test_deref_lays_sibling_keywords_over_the_target():
    document = SchemaDocument(ARGS)
    assert document.deref(ARGS["properties"]["color"]) == {**COLOR, "description": "paint"}
    assert document.deref(ARGS["properties"]["count"]) == {"type": "integer"}
    assert document.deref(TREE)["properties"] == NODE["properties"]


def test_bundles_point_into_their_own_defs_and_keep_recursion_a_ref():
    root = {"properties": {"tree": {"$ref": "#/definitions/Node"}, SAFE_JSON: {"$ref": f"#/$defs/{SAFE_JSON}"}},
            "definitions": {"Node": {"type": "object", "properties": {"kids": {"items": {"$ref": "#/properties/tree"}}}}},
            "$defs": {SAFE_JSON: {"type": "integer"}}}
    document = SchemaDocument(root)
    bundle = document.bundled(root["properties"]["tree"], reserved=(SAFE_JSON,))
    assert bundle["$ref"] == "#/$defs/Node" and "definitions" not in bundle
    node = bundle["$defs"]["Node"]
    assert node["properties"]["kids"]["items"] == {"$ref": "#/$defs/tree"}
    assert bundle["$defs"]["tree"] == {"$ref": "#/$defs/Node"}
    renamed = document.bundled(root["properties"][SAFE_JSON], reserved=(SAFE_JSON,))
    assert renamed == {"$ref": f"#/$defs/{SAFE_JSON}_2", "$defs": {f"{SAFE_JSON}_2": {"type": "integer"}}}
    SchemaDocument(bundle)  # the bundle is itself a valid document


def test_bundles_stop_at_a_node_budget():
    wide = {"$defs": {"big": {"anyOf": [{"type": "integer"}] * MAX_BUNDLED_NODES}},
            "properties": {"a": {"$ref": "#/$defs/big"}}}
    with pytest.raises(SchemaRefError, match="too large"):
        SchemaDocument(wide).bundled(wide["properties"]["a"])


# -- typing ------------------------------------------------------------------------------------------


def test_parameter_kinds_follow_refs_anyof_allof_and_recursion():
    document = SchemaDocument(ARGS)
    properties = ARGS["properties"]
    assert schema_kinds(properties["loc"], document) == {ValueKind.OBJECT}
    assert schema_kinds(properties["home"], document) == {ValueKind.OBJECT, ValueKind.NULL}
    assert schema_kinds(properties["color"], document) == {ValueKind.STRING}
    assert schema_kinds(properties["count"], document) == {ValueKind.INTEGER}
    assert schema_kinds({"allOf": [{"$ref": "#/$defs/Node"}], "description": "v1 style"}, document) == {ValueKind.OBJECT}
    assert schema_kinds({"$ref": "#/$defs/Location", "type": ["object", "null"]}, document) == {ValueKind.OBJECT}
    looping = SchemaDocument({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "integer"}]},
                                        "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}})
    assert schema_kinds({"$ref": "#/$defs/A"}, looping) == {ValueKind.INTEGER, ValueKind.NULL}
    assert schema_kinds(properties["loc"]) == frozenset()  # without its document a ref says nothing


def test_registry_types_arguments_through_refs():
    registry = ToolRegistry.from_openai(tools(ARGS) + tools(TREE, "walk"))
    assert typed_value(' {"lat": 1.5, "lon": 2} ', registry.kinds("f", "loc")) == ('{"lat": 1.5, "lon": 2}', True)
    assert typed_value("null", registry.kinds("f", "home")) == ("null", True)
    assert typed_value("7", registry.kinds("f", "count")) == ("7", True)
    assert typed_value("red", registry.kinds("f", "color")) == ('"red"', True)
    tree = '{"value": 1, "children": [{"value": 2}]}'
    assert typed_value(tree, registry.kinds("f", "tree")) == (tree, True)
    assert registry.kinds("walk", "value") == {ValueKind.INTEGER}  # properties under a top-level ref
    assert registry.kinds("walk", "children") == {ValueKind.ARRAY}


def test_registry_rejects_bad_refs():
    bad = {"type": "object", "properties": {"loc": {"$ref": "#/$defs/Nowhere"}}}
    with pytest.raises(SchemaRefError, match="'#/\\$defs/Nowhere' does not resolve"):
        ToolRegistry.from_openai(tools(bad))


def test_without_strings_looks_through_refs():
    document = SchemaDocument({"$defs": {"S": {"type": "string"}, "IS": {"type": ["integer", "string"]},
                                         "R": {"anyOf": [{"$ref": "#/$defs/R"}, {"$ref": "#/$defs/IS"}]}}})
    assert without_strings({"$ref": "#/$defs/IS"}, document) == {"type": ["integer"]}
    assert without_strings({"anyOf": [{"$ref": "#/$defs/S"}, {"type": "null"}]}, document) == {"anyOf": [{"type": "null"}]}
    assert without_strings({"$ref": "#/$defs/S"}, document) is None
    assert without_strings({"allOf": [{"$ref": "#/$defs/S"}]}, document) is None
    assert without_strings({"$ref": "#/$defs/R"}, document) == {"anyOf": [{"type": ["integer"]}]}


# -- response_format --------------------------------------------------------------------------------


def test_response_format_refs_are_checked_before_llguidance():
    ok = parse_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": TREE}})
    assert json.loads(ok.source) == TREE
    for ref in ("#/$defs/Missing", "https://example.com/node.json"):
        schema = {"type": "object", "properties": {"n": {"$ref": ref}}}
        with pytest.raises(SchemaRefError, match="response_format.json_schema.schema") as caught:
            parse_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
        assert ref in str(caught.value) and caught.value.http_status == 400


# -- end to end on an XTML model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def xtml():
    tokenizer = small_bpe(["<|endoftext|>"])
    eos = tokenizer.token_to_id("<|endoftext|>")
    contract = served_contract(tokenizer.get_vocab_size(), xtml_frontend(), [eos])
    model = FrontendModel.from_contract(contract, tokenizer, XTML_TEMPLATE, json_defaults=JSON_DEFAULTS)
    return model, tokenizer, eos


def prepare(xtml, **fields):
    model = xtml[0]
    body = {"model": model.served_id, "messages": [{"role": "user", "content": "Where?"}], **fields}
    return model.prepare_chat(ChatCompletionRequest.model_validate(body))


def call_text(arguments: dict[str, str], name: str = "f") -> str:
    args = "".join(f'<xtml:arg name="{key}">{value}</xtml:arg>\n' for key, value in arguments.items())
    return f'<xtml:calls>\n<xtml:call name="{name}">\n{args}</xtml:call>\n</xtml:calls>'


def accepts(prepared, tokenizer, text: str) -> bool:
    probe = prepared.grammar.fork()
    return all(probe.consume_token(t) for t in ids_of(tokenizer, text))


GOOD = {"loc": '{"lat": 1.5, "lon": -2}', "home": "null", "tree": '{"value": 1, "children": [{"value": 2, "children": []}]}',
        "color": "green", "count": "4"}


def test_forced_calls_follow_ref_schemas_and_parse_typed(xtml):
    model, tokenizer, eos = xtml
    prepared = prepare(xtml, tools=tools(ARGS), tool_choice="required")
    text = call_text(GOOD)
    assert accepts(prepared, tokenizer, text)
    _, final = run_output(prepared, ids_of(tokenizer, text) + [eos])
    (call,) = final.result.tool_calls
    assert json.loads(call.arguments) == {"loc": {"lat": 1.5, "lon": -2}, "home": None, "color": "green", "count": 4,
                                          "tree": {"value": 1, "children": [{"value": 2, "children": []}]}}
    for key, value in (("loc", "Paris"), ("loc", '{"lat": 1}'), ("color", "purple"), ("count", "four"),
                       ("tree", '{"value": 1, "children": [{"value": "x"}]}'), ("home", '"Rome"')):
        assert not accepts(prepared, tokenizer, call_text({**GOOD, key: value})), (key, value)


def test_forced_calls_of_a_recursive_top_level_model(xtml):
    _, tokenizer, _ = xtml
    prepared = prepare(xtml, tools=tools(TREE, "walk"), tool_choice="required")
    assert accepts(prepared, tokenizer, call_text({"value": "3", "children": '[{"value": 4, "children": [{"value": 5}]}]'}, "walk"))
    assert not accepts(prepared, tokenizer, call_text({"value": "3", "children": '[{"value": true}]'}, "walk"))


def test_structured_answers_follow_ref_schemas(xtml):
    model, tokenizer, eos = xtml
    response_format = {"type": "json_schema", "json_schema": {"name": "tree", "schema": TREE}}
    prepared = prepare(xtml, response_format=response_format)
    answer = '{"value": 1, "children": [{"value": 2, "children": []}]}'
    assert accepts(prepared, tokenizer, answer)
    assert not accepts(prepared, tokenizer, '{"value": 1, "children": [{"value": "2"')
    with_tools = prepare(xtml, tools=tools(ARGS), response_format=response_format)
    assert accepts(with_tools, tokenizer, answer) and accepts(with_tools, tokenizer, call_text(GOOD))


@pytest.mark.parametrize("fields", [
    {"tools": tools({"properties": {"a": {"$ref": "#/$defs/Gone"}}})},
    {"tools": tools({"properties": {"a": {"$ref": "#/$defs/Gone"}}}), "tool_choice": "required"},
    {"tools": tools({"properties": {"a": {"$ref": "https://example.com/a.json"}}})},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "#/definitions/Gone"}}}},
])
def test_bad_refs_fail_preparation_with_a_400(xtml, fields):
    with pytest.raises(SchemaRefError, match=r"\$ref '(#/\$defs/Gone|https://example.com/a.json|#/definitions/Gone)'") as caught:
        prepare(xtml, **fields)
    assert caught.value.http_status == 400 and not isinstance(caught.value, GrammarError)

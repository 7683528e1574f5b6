"""Hostile JSON schemas (``response_format`` and tool ``parameters``) and tool lists through the app
over the tiny core: each is refused before admission with an OpenAI-style 400 (413 for a body past
the size limit) whose ``param`` names the field at fault, or served; never a 500, a fetch or a hang,
and the server keeps serving after them. Assertions are on statuses and error bodies, never on time."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.server.app import create_app
from support.server_core import SERVED_ID, served_tiny_core


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


def post(app, text: str) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            return await client.post("/v1/chat/completions", content=text, headers={"content-type": "application/json"})

    return asyncio.run(scenario())


def chat(**fields) -> str:
    return json.dumps({"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields})


def answer(schema) -> str:
    return chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def function(name: str, parameters=None) -> dict:
    body = {"name": name} if parameters is None else {"name": name, "parameters": parameters}
    return {"type": "function", "function": body}


def calls(*tools, choice="required") -> str:
    return chat(tools=list(tools), tool_choice=choice)


def deep_schema(depth: int) -> str:
    schema = '{"type": "array", "items": ' * depth + "{}" + "}" * depth
    return chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": "@"}}).replace('"@"', schema)


OBJECT = {"type": "object", "properties": {"a": {"type": "string"}}}
REFUSED = {
    # (body, status, param, words of the message)
    "depth 10000": (deep_schema(10_000), 400, None, "nests deeper"),
    "10 MB schema": (answer({"type": "object", "description": "x" * 10_000_000}), 413, None, "at most"),
    "100k-item enum": (answer({"enum": [f"item{i}" for i in range(100_000)]}), 400,
                       "response_format.json_schema.schema", "at most 65536"),
    "false schema": (answer(False), 400, "response_format.json_schema.schema", "dictionary"),
    "non-object top level": (answer(["string"]), 400, "response_format.json_schema.schema", "dictionary"),
    "remote $ref": (answer({"$ref": "http://127.0.0.1:9/s.json"}), 400, "response_format", "is not local"),
    "file $ref": (answer({"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}}), 400,
                  "response_format", "is not local"),
    "$ref cycle": (answer({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
                   400, "response_format", "refers to itself"),
    "unsupported keyword": (answer({"type": "object", "not": {"type": "null"}}), 400, "response_format", "not"),
    "invalid regex": (answer({"type": "string", "pattern": "(("}), 400, "response_format", "regex parse error"),
    "minLength > maxLength": (answer({"type": "string", "minLength": 5, "maxLength": 2}), 400, "response_format",
                              "minLength (5) is greater than maxLength (2)"),
    "minimum > maximum": (answer({"type": "integer", "minimum": 5, "maximum": 2}), 400, "response_format",
                          "minimum (5) is greater than maximum (2)"),
    "unknown type in a type array": (answer({"type": ["string", "bogus"]}), 400, "response_format", "bogus"),
    "1500 patternProperties": (answer({"type": "object", "patternProperties": {
        f"^p{i}$": {"type": "integer"} for i in range(1500)}}), 400, "response_format", "patternProperties"),
    "50 patterns on one string": (answer({"type": "string", "allOf": [{"pattern": f"^[a-z]{{{i},}}$"} for i in range(50)]}),
                                  400, "response_format", "patterns together"),
    "64 x 64 nested self-referencing anyOf": (answer({"anyOf": [{"anyOf": [{"$ref": "#"}] * 64 + [{"type": "integer"}]}] * 64}),
                                              400, "response_format", "4096 alternatives that hold a $ref"),
    # Within the shape bound, but an output that starts with "[" opens more parser items than a row
    # holds: sampled, it ended the request with a 500 before any output.
    "128 self-referencing anyOf alternatives": (answer({"anyOf": [{"type": "array", "items": {"$ref": "#"}, "maxItems": i + 1}
                                                                  for i in range(128)] + [{"type": "integer"}]}),
                                                400, "response_format", "Current row has"),
    "anyOf of multipleOf near 1000": (answer({"anyOf": [{"type": "integer", "multipleOf": 997 - 2 * i} for i in range(4)]}),
                                      400, "response_format", "least common multiple"),
    "tool multipleOf 999983": (calls(function("f", {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 999983}}})),
                               400, "tools[0].function.parameters", "least common multiple is 999983"),
    "a chain of 1200 $refs": (answer({"$defs": {**{f"{i:x}": {"items": {"$ref": f"#/$defs/{i + 1:x}"}} for i in range(1200)},
                                                "4b0": {}}, "$ref": "#/$defs/0"}), 400, "response_format",
                              "levels deep through its $refs"),
    "tool file $ref": (calls(function("f", {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}})),
                       400, "tools[0].function.parameters", "is not local"),
    "tool 65 patternProperties": (calls(function("f", {"type": "object", "patternProperties": {
        f"^{i}$": {} for i in range(65)}})), 400, "tools[0].function.parameters", "65 patternProperties"),
    "tool invalid regex": (calls(function("f", {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}})),
                           400, "tools[0].function.parameters", "regex parse error"),
    "tool string parameters": (calls(function("f", {"type": "string"})), 400, "tools[0].function.parameters", "type \"object\""),
    "second tool's dangling $ref": (calls(function("f", OBJECT), function("g", {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/missing"}}})), 400, "tools[1].function.parameters", "does not resolve"),
    "second tool's regex, named": (calls(function("f", OBJECT), function("g", {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(("}}}), choice={"type": "function", "function": {"name": "g"}}),
        400, "tools[1].function.parameters", "regex parse error"),
    "second tool's unwritable enum": (calls(function("f", OBJECT), function("g", {"type": "object", "properties": {
        "a": {"enum": ["</parameter>"]}}, "required": ["a"]})), 400, "tools[1].function.parameters.properties.a",
        "holds the value closer"),
    "tool false parameters": (calls(function("f", False)), 400, "tools[0].function.parameters", "dictionary"),
    "duplicate tool names": (calls(function("f", OBJECT), function("f", {"type": "object"})), 400, "tools", "unique"),
    "tool name with a space": (calls(function("a b", OBJECT)), 400, "tools[0].function.name", "pattern"),
    "tool name with markup": (calls(function("a<b>", OBJECT)), 400, "tools[0].function.name", "pattern"),
    "tool name of 65 characters": (calls(function("x" * 65, OBJECT)), 400, "tools[0].function.name", "64"),
    "tool_choice naming a missing tool": (calls(function("f", OBJECT), choice={"type": "function", "function": {"name": "g"}}),
                                          400, "tool_choice", "undeclared function 'g'"),
    "129 tools": (calls(*(function(f"f{i}", OBJECT) for i in range(129))), 400, "tools", "128"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_hostile_schema_or_tool_list_is_a_4xx_naming_its_field(app, served, case):
    body, status, param, words = REFUSED[case]
    response = post(app, body)
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["type"]) == (status, param, "invalid_request_error"), error
    assert words in error["message"]
    assert served.admission.in_use == 0


SERVED = {
    "empty schema": answer({}),
    "type array": answer({"type": ["string", "integer", "null"]}),
    "unknown keyword": answer({"type": "object", "frobnicate": 1}),
    "catastrophic-backtracking regex": answer({"type": "string", "pattern": "^(a+)+$"}),
    "64 patternProperties": answer({"type": "object", "patternProperties": {f"^p{i}$": {"type": "integer"} for i in range(64)}}),
    "64 self-referencing anyOf alternatives": answer({"anyOf": [{"type": "array", "items": {"$ref": "#"}, "maxItems": i + 1}
                                                                for i in range(64)] + [{"type": "integer"}]}),
    "multipleOf 0.01, 15 and 3600": answer({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0.01},
                                                                             "b": {"type": "integer", "multipleOf": 15},
                                                                             "c": {"type": "integer", "multipleOf": 3600}}}),
    "recursive $ref": answer({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}}}}),
    "tool keywords llguidance lacks": calls(function("f", {"type": "object", "not": {}, "properties": {"a": {"type": "string"}}})),
    "tool name with dots and dashes": calls(function("a.b-c", OBJECT)),
}


@pytest.mark.parametrize("case", list(SERVED))
def test_odd_but_valid_schemas_are_served(app, served, case):
    response = post(app, SERVED[case])
    assert response.status_code == 200, response.text
    assert served.admission.in_use == 0

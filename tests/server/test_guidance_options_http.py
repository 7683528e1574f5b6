"""A client schema's llguidance options through the app over the tiny core: an option that could
make the output something other than JSON (``whitespace_pattern`` and the like) is an OpenAI-style
400 whose ``param`` names the field, for a ``json_schema`` answer, a ``%json`` schema in a grammar
and a forced call's tool parameters; the options a client may set are served. Before, each was
compiled as given (a ``json_schema`` answer written with letters between its tokens)."""

from __future__ import annotations

import httpx
import pytest

from support.server_core import SERVED_ID

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def post(runner, app, **fields) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
            return await client.post("/v1/chat/completions", json=body)

    return runner.run(scenario())


def json_schema(options) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {**OBJECT, "x-guidance": options}}}


@pytest.mark.parametrize("fields, param, option", [
    ({"response_format": json_schema({"whitespace_pattern": "[a-z]+"})}, "response_format", "whitespace_pattern"),
    ({"response_format": {"type": "grammar", "grammar": 'start: %json {"x-guidance": {"item_separator": ";"}}'}},
     "response_format", "item_separator"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        **OBJECT, "x-guidance": {"key_separator": "</tool_call>"}}}}], "tool_choice": "required"},
     "tools[0].function.parameters", "key_separator"),
])
def test_an_option_that_can_break_json_is_a_400_naming_the_field(runner, app, fields, param, option):
    response = post(runner, app, **fields)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param, response.text
    assert f"'{option}'" in error["message"], error


def test_the_options_a_client_may_set_are_served(runner, app):
    response = post(runner, app, response_format=json_schema({"whitespace_flexible": True, "coerce_one_of": True,
                                                              "lenient": True}))
    assert response.status_code == 200, response.text

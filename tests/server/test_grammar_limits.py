"""Structured-output grammars past llguidance's limits, through the app over the tiny core: a grammar
whose lexer limits show at the answer's first masks (or a tool schema that cannot constrain its
arguments) is a 400 before admission; one that reaches a limit only deep in the output ends that
choice with finish_reason ``grammar_limit`` and the text its grammar took
(`test_grammar_limit_http.py`, which uses `LATE_LIMIT`), never as a successful stop."""

from __future__ import annotations

import random

import httpx
import pytest

from support.server_core import assert_serving, chat_body, post_chats


def post(app, body: dict) -> httpx.Response:
    return post_chats(app, body)[0]


def many_terminals_lark(count: int = 1500) -> str:
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 12))) for _ in range(count)]
    terminals = "\n".join(f"T{i}: /[a-z]{{1,{i % 20 + 1}}}[0-9]+{word}/" for i, word in enumerate(words))
    return "start: t*\nt: " + " | ".join(f"T{i}" for i in range(count)) + "\n" + terminals


PAST_THE_LIMITS = {
    "regex": {"type": "regex", "regex": "a{100000}"},
    "json_schema pattern": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "string", "pattern": "^a{1000000}$"}}},
    "lark terminals": {"type": "grammar", "grammar": many_terminals_lark()},
}


@pytest.mark.parametrize("name", list(PAST_THE_LIMITS))
def test_a_response_format_past_the_lexer_limits_is_a_400(app, served, name):
    response = post(app, chat_body(max_tokens=24, temperature=0, response_format=PAST_THE_LIMITS[name]))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "exceeds llguidance's limits" in error["message"]
    assert_serving(app, served)


BAD_TOOL_PARAMETERS = {
    "top-level string": ({"type": "string"}, 'must be a JSON schema of type "object"'),
    "unknown type": ({"type": "bogus"}, 'must be a JSON schema of type "object"'),
    "invalid pattern": ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}},
                        "regex parse error"),
    "pattern past the lexer limits": ({"type": "object", "required": ["a"],
                                       "properties": {"a": {"type": "string", "pattern": "^a{100000}$"}}},
                                      "exceeds llguidance's limits"),
}


@pytest.mark.parametrize("name", list(BAD_TOOL_PARAMETERS))
def test_a_tool_schema_that_cannot_constrain_its_arguments_is_a_400_naming_the_tool(app, served, name):
    parameters, reason = BAD_TOOL_PARAMETERS[name]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": parameters}}]
    for choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
        response = post(app, chat_body(max_tokens=8, tools=tools, tool_choice=choice))
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert message.startswith("tool 'lookup' parameters: ") and reason in message
    assert_serving(app, served)


# Constructs and passes the compile check (its first masks and tokens are fine); the lexer reaches
# its state limit only when the answer nears the second terminal, a dozen tokens in
# (`test_grammar_limit_http.py`).
LATE_LIMIT = {"type": "grammar", "grammar": "start: /[b-z]{40}/ /a{100000}/"}

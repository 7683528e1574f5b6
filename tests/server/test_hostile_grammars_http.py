"""Lark grammars whose compile would recurse past a safe native stack, through the app over the tiny
core: a 400 naming ``response_format`` and why, before admission, and the server goes on serving.

Before, such a grammar (a 5,000-rule chain, 58 kB) passed the serving process's check, which runs on
the preparation pool's large stack; an engine process, which compiles every admitted grammar again on
its main thread, died of the stack overflow (a 500, then 503 for every request). The in-process app
here answered 200. Assertions are on statuses and error bodies, never on time."""

from __future__ import annotations

import json

import pytest

from support.server_core import SERVED_ID
from test_hostile_schemas_http import post


def grammar(text: str) -> str:
    return json.dumps({"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "response_format": {"type": "grammar", "grammar": text}})


def chain(count: int) -> str:
    return "\n".join(["start: a0", *(f"a{i}:a{i + 1}" for i in range(count)), f'a{count}:"b"'])


def json_ref_chain(count: int) -> str:
    defs = {f"{i:x}": {"items": {"$ref": f"#/$defs/{i + 1:x}"}} for i in range(count)}
    return "start: %json " + json.dumps({"$defs": {**defs, f"{count:x}": {}}, "$ref": "#/$defs/0"})


DEEP = {
    "a 5,000-rule chain": (chain(5000), "5002 levels deep"),
    "a %json schema of 1,200 chained $refs": (json_ref_chain(1200), "more than 128 levels deep through its $refs"),
}


@pytest.mark.parametrize("case", list(DEEP))
def test_a_grammar_too_deep_to_compile_safely_is_a_400_and_the_server_serves_on(app, served, case):
    text, words = DEEP[case]
    response = post(app, grammar(text))
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["type"]) == (400, "response_format", "invalid_request_error")
    assert words in error["message"]
    assert post(app, grammar('start: "ok"')).status_code == 200
    assert served.admission.in_use == 0

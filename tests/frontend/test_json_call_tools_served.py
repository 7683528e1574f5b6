"""Forced tool calls of a JSON-call family (Hermes: ``<tool_call>`` JSON blocks), through the served HTTP
app over the family's tiny random core at temperature 1 (`test_json_call_grammars` checks the grammars
themselves).

A named ``tool_choice`` returns exactly one call of that function: its grammar demanded exactly two
before, so every such response carried the function twice. A parameters schema whose top level also
allows a string returns calls whose arguments are JSON objects, and one that allows no object at all is
a 400 naming the tool's parameters: before, the grammar wrote a string or a number as the arguments,
which the parser refused, and the forced call came back as no call."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.family_checkpoints import CASES, FAMILY_NAMESPACE, prepared_family_core

HERMES = next(case for case in CASES if case.name == "hermes")
OBJECT = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def hermes(tmp_path_factory, qwen_tokenizer, deepseek_tokenizer):
    _, opened = prepared_family_core(HERMES, tmp_path_factory.getbasetemp(), qwen_tokenizer, deepseek_tokenizer)
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=4)), queue_capacity=4,
                                      frontend_workers=1, owned_by=FAMILY_NAMESPACE)
    served.start()
    with asyncio.Runner() as runner:
        yield create_app(served), runner
    served.shutdown()


def post(hermes, **fields) -> httpx.Response:
    app, runner = hermes
    body = {"model": HERMES.name, "messages": [{"role": "user", "content": "Weather in Paris?"}], "temperature": 1.0,
            "max_tokens": 160, "chat_template_kwargs": {"enable_thinking": False}, **fields}

    async def call():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await client.post("/v1/chat/completions", json=body)

    return runner.run(call())


def function(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def calls_of(response: httpx.Response) -> list[tuple[str, object]]:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_named_tool_choice_returns_exactly_one_call(hermes, seed):
    named = {"type": "function", "function": {"name": "get_weather"}}
    response = post(hermes, tools=[function("get_weather", OBJECT), function("get_time", OBJECT)], tool_choice=named,
                     seed=seed)
    assert [name for name, _ in calls_of(response)] == ["get_weather"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_forced_arguments_are_an_object_when_the_schema_also_allows_a_string(hermes, seed):
    loose = {"anyOf": [OBJECT, {"type": "string"}]}
    calls = calls_of(post(hermes, tools=[function("f", loose)], tool_choice="required", seed=seed))
    assert calls and all(name == "f" and arguments["city"] in ("Paris", "Rome") for name, arguments in calls)


def test_parameters_that_allow_no_object_are_a_400_naming_them(hermes):
    response = post(hermes, tools=[function("f", {"enum": [1, "x"]})], tool_choice="required")
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["type"]) == (400, "tools[0].function.parameters",
                                                                     "invalid_request_error")
    assert "Unsatisfiable" in error["message"]

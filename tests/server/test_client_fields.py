"""Fields OpenAI clients send, through the official `openai` client over the in-process app (ASGI):
off values and bookkeeping fields are accepted, streamed and not; their other values are a 400;
a request that can never fit the context extent is a 400 naming the limit."""

from __future__ import annotations


import openai
import pytest

from helios.server.app import create_app
from support.server_core import NAMESPACE, SERVED_ID, openai_client, served_tiny_core

ACCEPTED_CHAT_FIELDS = {
    "logprobs": False, "top_logprobs": None, "user": "user-1", "metadata": {"run": "7", "team": "eval"},
    "store": False, "service_tier": "auto", "parallel_tool_calls": True, "reasoning_effort": "low",
}
ACCEPTED_COMPLETION_FIELDS = {"logprobs": None, "user": "u"}  # the client's own completion arguments
COMPLETION_EXTRA = {"metadata": {"k": "v"}, "store": False, "service_tier": "default"}
REFUSED = [
    ("store", True), ("service_tier", "flex"), ("reasoning_effort", "extreme"), ("top_logprobs", 3),
    ("metadata", {f"k{i}": "v" for i in range(17)}), ("metadata", {"k": "v" * 513}), ("metadata", {"k": 1}),
    ("not_a_field", 1),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2, owned_by=NAMESPACE) as served:
        yield served


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served)


def chat(client, **fields):
    return client.chat.completions.create(model=SERVED_ID, messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=3, temperature=0, **fields)


async def collect(stream) -> list:
    return [chunk async for chunk in stream]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_accepts_the_fields_clients_send(runner, client, stream):
    plain = runner.run(chat(client))
    with_fields = runner.run(chat(client, stream=stream, **ACCEPTED_CHAT_FIELDS))
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in runner.run(collect(with_fields)) if c.choices)
    else:
        text = with_fields.choices[0].message.content
    assert text == plain.choices[0].message.content  # none of them changes this model's answer


@pytest.mark.parametrize("stream", [False, True])
def test_completions_accept_the_fields_clients_send(runner, client, stream):
    response = runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=3, temperature=0,
                                                    stream=stream, extra_body=COMPLETION_EXTRA,
                                                    **ACCEPTED_COMPLETION_FIELDS))
    if stream:
        response = runner.run(collect(response))
        assert response[-1].choices[0].finish_reason == "length"
    else:
        assert response.usage.completion_tokens == 3


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_other_values_are_400_naming_the_field(runner, client, field, value):
    with pytest.raises(openai.BadRequestError) as caught:
        runner.run(chat(client, extra_body={field: value}))
    assert field in caught.value.body["message"]


def test_completion_logprobs_beyond_20_are_400(runner, client):
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=2, logprobs=21))


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_beyond_the_context_extent_is_400_naming_it(runner, client, served, stream):
    with pytest.raises(openai.BadRequestError, match=f"context extent of {served.card.context_tokens} tokens"):
        runner.run(chat(client, stream=stream, extra_body={"max_tokens": 4096}))
    with pytest.raises(openai.BadRequestError, match="leaves no room"):
        runner.run(client.completions.create(model=SERVED_ID, prompt=[5] * served.card.context_tokens,
                                             stream=stream))


def test_omitted_max_tokens_means_up_to_the_rest_of_the_context(runner, client, served):
    room = 3
    prompt = [5] * (served.card.context_tokens - room)
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, temperature=0))
    assert response.usage.completion_tokens <= room
    assert response.choices[0].finish_reason in ("length", "stop")


def _readme_fields() -> set[str]:
    import re
    from pathlib import Path

    text = Path(__file__).resolve().parents[2].joinpath("README.md").read_text()
    table = text.split("### Request fields", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    fields = set()
    for row in table.splitlines()[2:]:
        first_cell = row.split("|")[1]
        fields.update(name.split(".")[0] for name in re.findall(r"`([a-z_.]+)`", first_cell))
    return fields


def test_readme_and_openapi_list_every_accepted_field(runner, client, served):
    from helios.server.schemas import ChatCompletionRequest, CompletionRequest

    accepted = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    assert _readme_fields() == accepted
    document = create_app(served).openapi()
    schemas = document["components"]["schemas"]
    for name, model in (("ChatCompletionRequest", ChatCompletionRequest), ("CompletionRequest", CompletionRequest)):
        properties = schemas[name]["properties"]
        assert set(properties) == set(model.model_fields) and schemas[name]["additionalProperties"] is False
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert "enable_thinking" in chat["reasoning_effort"]["description"]
    assert [branch.get("const") for branch in chat["store"]["anyOf"]] == [False, None]
    assert [branch.get("enum") for branch in chat["service_tier"]["anyOf"]] == [["auto", "default"], None]

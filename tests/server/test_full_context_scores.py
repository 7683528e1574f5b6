"""A request that generates nothing (``max_tokens: 0``: an echo, prompt scores) needs no room for an
output token: a prompt of the whole context extent is served through HTTP, with and without echo
log-probabilities or ``prompt_logprobs``, streamed and not, its scores equal to `transformers`'
within 1e-4; one token more is a 400 naming the prompt and both lengths, and a prompt of the whole
context with ``max_tokens: 1`` stays a 400 (its output token needs a position)."""

from __future__ import annotations

import random

import httpx
import openai
import pytest

from support.server_core import SERVED_ID, openai_client

from test_prompt_scores import TOP, _check_echo, _check_vllm, _collect, _scored_core, _serve  # tests/server is on sys.path (no package)

CONTEXT = 128  # the scored core's context extent


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return _scored_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def served(core):
    served = _serve(core)
    yield served
    served.shutdown()


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served)


@pytest.fixture(scope="module")
def reference(core):
    from support.logprob_runs import transformers_logprob_table

    return transformers_logprob_table(core.path.parent / "checkpoint")


def prompt_of(length: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 300) for _ in range(length)]


def test_the_card_names_the_context_these_tests_fill(served):
    assert served.card.context_tokens == CONTEXT


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_of_the_whole_context(runner, client, served, reference, stream):
    prompt = prompt_of(CONTEXT)
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=0, echo=True,
                                                    logprobs=TOP, stream=stream))
    if stream:
        chunks = runner.run(_collect(response))
        assert chunks[-1].choices[0].finish_reason == "length"
        logprobs = chunks[0].choices[0].logprobs
    else:
        assert response.usage.prompt_tokens == CONTEXT and response.usage.completion_tokens == 0
        assert response.choices[0].finish_reason == "length"
        logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == CONTEXT
    _check_echo(served, reference, prompt, logprobs)


def test_prompt_logprobs_and_a_plain_echo_of_the_whole_context(runner, client, served, reference):
    prompt = prompt_of(CONTEXT, seed=4)
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=0,
                                                    extra_body={"prompt_logprobs": TOP}))
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 0
    _check_vllm(served, reference, prompt, response.choices[0].model_extra["prompt_logprobs"])
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=0, echo=True, n=2))
    assert [c.text for c in response.choices] == [served.frontend._tokenizer.decode(prompt, skip_special_tokens=False)] * 2
    assert response.usage.completion_tokens == 0


@pytest.mark.parametrize("fields", [{"echo": True, "logprobs": TOP}, {"echo": True},
                                    {"extra_body": {"prompt_logprobs": 1}}])
def test_one_token_past_the_context_is_a_400_naming_the_prompt_and_both_lengths(runner, client, fields):
    with pytest.raises(openai.BadRequestError) as caught:
        runner.run(client.completions.create(model=SERVED_ID, prompt=prompt_of(CONTEXT + 1), max_tokens=0, **fields))
    error = caught.value.body
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error", error
    assert f"the prompt is {CONTEXT + 1} tokens" in error["message"], error
    assert f"the context extent is {CONTEXT} tokens" in error["message"], error


def test_an_output_token_still_needs_room(runner, served):
    from helios.server.app import create_app

    async def post(body: dict) -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(served))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.post("/v1/completions", json={"model": SERVED_ID, **body})

    full = prompt_of(CONTEXT)
    response = runner.run(post({"prompt": full, "max_tokens": 1, "echo": True, "logprobs": 1}))
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt", response.text
    assert "leaves no room for output" in response.json()["error"]["message"]
    response = runner.run(post({"prompt": full[:-1], "max_tokens": 1, "temperature": 0}))
    assert response.status_code == 200 and response.json()["usage"]["total_tokens"] == CONTEXT, response.text
    response = runner.run(post({"prompt": [full, full[:5]], "max_tokens": 0, "echo": True}))  # a batch
    assert response.status_code == 200 and len(response.json()["choices"]) == 2, response.text
    response = runner.run(post({"prompt": [full[:5], full + [7]], "max_tokens": 0, "echo": True}))
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt[1]", response.text

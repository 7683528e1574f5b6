"""Prompt scores through the official `openai` client over the in-process app (ASGI), on a core
prepared with scored prefill: ``echo`` + ``logprobs`` (``max_tokens: 0`` included) and vLLM's
``prompt_logprobs`` on both endpoints equal ``log_softmax`` of `transformers`' logits within 1e-4,
streamed and not, for prompts longer than one scored-prefill step; a core without scored prefill
answers 400 naming it."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.service import ServedModel
from support.logprob_runs import transformers_logprob_table
from support.server_core import SERVED_ID, TinyCore, openai_client, scored_core, tiny_core

TOLERANCE = 1e-4
TOP = 3
PREFILL_TOKENS = 16  # the scored core's prefill steps
LONG_PROMPT = [(7 * i) % 300 + 10 for i in range(40)]  # three scored-prefill steps


def _scored_core(base: Path) -> TinyCore:
    """The tiny core's checkpoint prepared with scored prefill, once per run (`support.server_core.scored_core`:
    test_echo_offsets, test_full_context_scores, test_stream_parity and test_logprobs_reference serve it too)."""
    return scored_core(base)


def _serve(core: TinyCore):
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=4)), queue_capacity=4,
                                      frontend_workers=2, owned_by=core.namespace)
    served.start()
    return served


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
    return transformers_logprob_table(core.path.parent / "checkpoint")


def _text(served, token_id: int) -> str:
    return served.frontend._token_texts.text(token_id)


def _check_echo(served, reference, prompt, logprobs) -> None:
    table = reference(prompt)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.tokens[: len(prompt)] == [_text(served, t) for t in prompt]
    for i in range(1, len(prompt)):
        assert abs(logprobs.token_logprobs[i] - table[i - 1][prompt[i]].item()) < TOLERANCE
        best = torch.topk(table[i - 1], TOP)
        expected = {}
        for token, value in zip(best.indices.tolist(), best.values.tolist()):
            expected.setdefault(_text(served, token), value)
        assert logprobs.top_logprobs[i].keys() == expected.keys()
        assert max(abs(logprobs.top_logprobs[i][k] - v) for k, v in expected.items()) < TOLERANCE


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_and_no_output_scores_the_prompt(runner, client, served, reference, stream):
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=LONG_PROMPT, max_tokens=0, echo=True,
                                                    logprobs=TOP, stream=stream))
    if stream:
        chunks = runner.run(_collect(response))
        first = chunks[0].choices[0]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].text for c in chunks if c.choices) == first.text
        logprobs = first.logprobs
    else:
        assert response.usage.completion_tokens == 0 and response.choices[0].finish_reason == "length"
        first = response.choices[0]
        logprobs = first.logprobs
        assert len(logprobs.tokens) == len(LONG_PROMPT)
    assert first.text == served.frontend._tokenizer.decode(LONG_PROMPT, skip_special_tokens=False)
    _check_echo(served, reference, LONG_PROMPT, logprobs)


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


def test_echo_with_output_lists_prompt_then_output_tokens(runner, client, served, reference):
    prompt = LONG_PROMPT[:20]
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=3, echo=True,
                                                    logprobs=TOP, temperature=0))
    choice = response.choices[0]
    assert response.usage.completion_tokens == 3
    assert len(choice.logprobs.tokens) == len(prompt) + 3
    assert choice.text.startswith(served.frontend._tokenizer.decode(prompt, skip_special_tokens=False))
    _check_echo(served, reference, prompt, choice.logprobs)


def _check_vllm(served, reference, prompt, body) -> None:
    table = reference(prompt)
    assert len(body) == len(prompt) and body[0] is None
    for i in range(1, len(prompt)):
        item = body[i]
        assert abs(item[str(prompt[i])]["logprob"] - table[i - 1][prompt[i]].item()) < TOLERANCE
        best = torch.topk(table[i - 1], TOP).indices.tolist()
        assert {str(t) for t in best} | {str(prompt[i])} == set(item)
        assert all(item[str(t)]["rank"] == rank for rank, t in enumerate(best, 1))


@pytest.mark.parametrize("stream", [False, True])
def test_completion_prompt_logprobs(runner, client, served, reference, stream):
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=LONG_PROMPT, max_tokens=2,
                                                    temperature=0, stream=stream,
                                                    extra_body={"prompt_logprobs": TOP}))
    if stream:
        chunks = runner.run(_collect(response))
        body = next(c.choices[0].model_extra["prompt_logprobs"] for c in chunks
                    if c.choices and c.choices[0].model_extra.get("prompt_logprobs"))
    else:
        body = response.choices[0].model_extra["prompt_logprobs"]
        assert response.usage.completion_tokens == 2
    _check_vllm(served, reference, LONG_PROMPT, body)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_prompt_logprobs(runner, client, served, reference, stream):
    kwargs = dict(model=SERVED_ID, messages=[{"role": "user", "content": "hello there"}], max_tokens=2, temperature=0)
    ids = runner.run(client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True}))
    response = runner.run(client.chat.completions.create(**kwargs, stream=stream, extra_body={"prompt_logprobs": TOP}))
    if stream:
        body = next(c.model_extra["prompt_logprobs"] for c in runner.run(_collect(response))
                    if c.model_extra.get("prompt_logprobs"))
    else:
        body = response.model_extra["prompt_logprobs"]
    _check_vllm(served, reference, ids.model_extra["prompt_token_ids"], body)


def test_max_tokens_0_needs_echo_or_prompt_logprobs(runner, client):
    with pytest.raises(openai.BadRequestError, match="max_tokens 0"):
        runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=0))


@pytest.fixture(scope="module")
def plain_client(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())  # prepared without --scored-prefill
    served = _serve(core)
    yield openai_client(served)
    served.shutdown()


@pytest.mark.parametrize("fields", [{"echo": True, "logprobs": 1, "max_tokens": 0},
                                    {"extra_body": {"prompt_logprobs": 0}, "max_tokens": 2}])
def test_a_core_without_scored_prefill_answers_400_naming_it(runner, plain_client, fields):
    with pytest.raises(openai.BadRequestError, match="no scored-prefill program"):
        runner.run(plain_client.completions.create(model=SERVED_ID, prompt="hello", **fields))


def test_echo_without_logprobs_needs_no_scores(runner, plain_client):
    response = runner.run(plain_client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=2, echo=True,
                                                          temperature=0))
    assert response.choices[0].text.startswith("hello") and response.choices[0].logprobs is None
    assert response.usage.completion_tokens == 2

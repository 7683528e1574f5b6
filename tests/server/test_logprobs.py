"""Token log-probabilities through the official `openai` client over the in-process app (ASGI):
greedy values equal ``log_softmax`` of `transformers`' logits for the same prefix, chat and
completions, streamed and not; steps without a request asking for them run the plain programs;
a core prepared without token-logprobs programs answers 400 naming the missing capability."""

from __future__ import annotations


import openai
import pytest
import torch

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.service import ServedModel
from support.logprob_runs import transformers_logprob_table
from support.server_core import SERVED_ID, openai_client, tiny_core

TOLERANCE = 1e-4
TOP = 5


def _serve(core):
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=4)), queue_capacity=4,
                                      frontend_workers=2, owned_by=core.namespace)
    served.start()
    return served


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


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


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


def _check_entries(reference, prompt_ids, output_ids, chosen, tops, token_text) -> None:
    """`chosen[i]` and the `tops[i]` (text -> logprob) equal the reference after prompt + outputs[:i]."""
    assert chosen and len(chosen) <= len(output_ids)
    table = reference(list(prompt_ids) + list(output_ids))
    for i, value in enumerate(chosen):
        row = table[len(prompt_ids) - 1 + i]
        assert abs(value - row[output_ids[i]].item()) < TOLERANCE
        assert output_ids[i] == int(row.argmax())  # greedy: the chosen token is the most probable
        expected: dict[str, float] = {}
        for token, value in zip(*(t.tolist() for t in torch.topk(row, TOP)[::-1])):
            expected.setdefault(token_text(token), value)  # ids that decode alike: the likelier one
        assert tops[i].keys() == expected.keys()
        assert max(abs(tops[i][text] - value) for text, value in expected.items()) < TOLERANCE


def _text_of(served):
    return lambda token_id: served.frontend._token_texts.text(token_id)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_equal_transformers(runner, client, served, reference, stream):
    ids = runner.run(client.chat.completions.create(
        model=SERVED_ID, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0,
        extra_body={"return_token_ids": True}))
    response = runner.run(client.chat.completions.create(
        model=SERVED_ID, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=TOP, stream=stream))
    if stream:
        content = [item for chunk in runner.run(_collect(response)) if chunk.choices and chunk.choices[0].logprobs
                   for item in chunk.choices[0].logprobs.content]
    else:
        content = response.choices[0].logprobs.content
    assert all(len(item.top_logprobs) == TOP for item in content)
    # a token holding part of a character reads U+FFFD; its bytes are its own (test_openai_conformance)
    assert all(item.bytes == list(item.token.encode()) for item in content if "\ufffd" not in item.token)
    tops = []
    for item in content:
        tops.append({})
        for alt in item.top_logprobs:  # most probable first: the first of two alike texts wins
            tops[-1].setdefault(alt.token, alt.logprob)
    _check_entries(reference, ids.model_extra["prompt_token_ids"], ids.choices[0].model_extra["token_ids"],
                   [item.logprob for item in content], tops, _text_of(served))


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_equal_transformers(runner, client, served, reference, stream):
    prompt = [40, 41, 42, 43]
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=4, temperature=0,
                                                    logprobs=TOP, stream=stream,
                                                    extra_body={"return_token_ids": True}))
    if stream:
        chunks = runner.run(_collect(response))
        parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        output_ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
        tokens = [t for p in parts for t in p.tokens]
        chosen = [v for p in parts for v in p.token_logprobs]
        tops = [t for p in parts for t in p.top_logprobs]
        offsets = [o for p in parts for o in p.text_offset]
    else:
        logprobs = response.choices[0].logprobs
        output_ids = response.choices[0].model_extra["token_ids"]
        tokens, chosen, tops, offsets = logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, logprobs.text_offset
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    _check_entries(reference, prompt, output_ids, chosen, tops, _text_of(served))


def test_steps_without_logprobs_run_the_plain_programs(runner, client, served):
    executor = served.engine.executor
    chosen = []
    original = executor._program_for

    def spy(plan):
        program = original(plan)
        chosen.append(program.token_logprobs)
        return program

    executor._program_for = spy
    try:
        runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=3, temperature=0))
        assert chosen and not any(chosen)
        chosen.clear()
        runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=3, temperature=0,
                                             logprobs=0))
        assert chosen and all(chosen)
    finally:
        del executor._program_for


def test_sampled_requests_get_logprobs_of_their_tokens(runner, client):
    response = runner.run(client.chat.completions.create(
        model=SERVED_ID, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=1.0, seed=5,
        logprobs=True))
    content = response.choices[0].logprobs.content
    assert content and all(item.logprob <= 0 and item.top_logprobs == [] for item in content)


@pytest.mark.parametrize(("fields", "message"), [
    ({"top_logprobs": 2}, "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_bad_chat_logprob_fields_are_400(runner, client, fields, message):
    with pytest.raises(openai.BadRequestError, match=message):
        runner.run(client.chat.completions.create(model=SERVED_ID, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2, **fields))


def test_completion_logprobs_above_20_are_400(runner, client):
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=2, logprobs=21))


def test_a_core_without_logprob_programs_answers_400_naming_it(runner, tmp_path):
    from helios.core.keys import SigningKey, write_key_pair
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
    from ignition.hf_checkpoints import QWEN3
    from support.chat_checkpoint import write_chat_checkpoint
    from support.server_core import NAMESPACE, TinyCore

    key = SigningKey.generate()
    write_key_pair(tmp_path / "publisher.key", key, [NAMESPACE])
    checkpoint = write_chat_checkpoint(QWEN3, tmp_path / "checkpoint", seed=3)
    plan = CapacityPlan(context_tokens=64, prefill_tokens=16, decode_batches=(1,), mixed=False, token_logprobs=False)
    prepare_core(checkpoint, tmp_path / "model.core", key,
                 PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan))
    served = _serve(TinyCore(tmp_path / "model.core", tmp_path / "publisher.key.pub"))
    try:
        client = openai_client(served)
        with pytest.raises(openai.BadRequestError, match="no token-logprobs programs"):
            runner.run(client.chat.completions.create(model=SERVED_ID, messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=2, logprobs=True))
        with pytest.raises(openai.BadRequestError, match="no token-logprobs programs"):
            runner.run(client.completions.create(model=SERVED_ID, prompt="hi", max_tokens=2, logprobs=1, stream=True))
        plain = runner.run(client.completions.create(model=SERVED_ID, prompt="hi", max_tokens=2, logprobs=None))
        assert plain.choices[0].logprobs is None
    finally:
        served.shutdown()

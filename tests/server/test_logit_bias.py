"""``logit_bias`` through the official `openai` client over the in-process app (ASGI): +100 forces
a token and -100 bans the greedy one (chat and completions, streamed and not), logprobs report the
biased distribution, bad entries are 400s naming them; a core prepared before logit bias,
token-logprobs variants and prompt scores existed (the committed fixture core) answers each with
a 400 naming the missing capability."""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

from helios.core.reader import open_core
from helios.frontend.preparation.logit_bias import LogitBiasError, parse_logit_bias
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, openai_client, tiny_core

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FORCED = 77


def _serve(opened) -> ServedModel:
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=4)), queue_capacity=4,
                                      frontend_workers=2)
    served.start()
    return served


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    served = _serve(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]))
    yield openai_client(served)
    served.shutdown()


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


def _completion_ids(runner, client, stream: bool, **fields) -> list[int]:
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=[40, 41, 42], max_tokens=3, temperature=0,
                                                    stream=stream, extra_body={"return_token_ids": True}, **fields))
    if stream:
        return [t for c in runner.run(_collect(response)) if c.choices for t in c.choices[0].model_extra.get("token_ids") or []]
    return response.choices[0].model_extra["token_ids"]


@pytest.mark.parametrize("stream", [False, True])
def test_plus_100_forces_and_minus_100_bans(runner, client, stream):
    assert _completion_ids(runner, client, stream, logit_bias={str(FORCED): 100}) == [FORCED] * 3
    greedy = _completion_ids(runner, client, stream)
    banned = _completion_ids(runner, client, stream, logit_bias={str(greedy[0]): -100})
    assert banned[0] != greedy[0]
    nudged = _completion_ids(runner, client, stream, logit_bias={str(FORCED): 0.5})  # too small to matter here
    assert nudged == greedy


def test_chat_bias_and_logprobs_of_the_biased_distribution(runner, client):
    response = runner.run(client.chat.completions.create(
        model=SERVED_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0,
        logit_bias={str(FORCED): 100}, logprobs=True, extra_body={"return_token_ids": True}))
    assert response.choices[0].model_extra["token_ids"] == [FORCED, FORCED]
    assert all(item.logprob > -1e-3 for item in response.choices[0].logprobs.content)  # all but certain


@pytest.mark.parametrize(("bias", "message"), [
    ({"999999": 1}, "outside the vocabulary"),
    ({"5": 101}, "logit_bias"),
    ({"x": 1}, "logit_bias"),
    ({str(i): 1 for i in range(301)}, "logit_bias"),
])
def test_bad_logit_bias_is_400(runner, client, bias, message):
    with pytest.raises(openai.BadRequestError, match=message):
        runner.run(client.completions.create(model=SERVED_ID, prompt="hi", max_tokens=2, logit_bias=bias))


DUPLICATE = "logit_bias names token 5 twice ('0005' and '5')"


@pytest.mark.parametrize("fields", [{}, {"n": 2}, {"stream": True}, {"stream": True, "n": 2}])
def test_two_keys_naming_one_token_are_400_naming_both(runner, client, fields):
    """"0005" and "5" are distinct keys of one token: a client mistake found while preparing, not an
    admission rejection (503, or a stream ending in an error event) from the engine."""
    with pytest.raises(openai.BadRequestError) as caught:
        runner.run(client.completions.create(model=SERVED_ID, prompt="hi", max_tokens=2,
                                             logit_bias={"0005": 5, "5": -5}, **fields))
    error = caught.value.body
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["message"] == DUPLICATE


def test_parse_logit_bias_refuses_a_token_named_twice():
    assert parse_logit_bias({"05": 1, "7": -2}, vocab_size=16, capacity=4) == ((5, 1.0), (7, -2.0))
    with pytest.raises(LogitBiasError, match=re.escape(DUPLICATE)):
        parse_logit_bias({"0005": 5, "5": -5}, vocab_size=16, capacity=4)


@pytest.fixture(scope="module")
def old_client():
    key = FIXTURES / "cores" / "TEST-ONLY-signing.key.pub"
    opened = open_core(FIXTURES / "models" / "tiny_qwen3.core", accept="test.helios/fixtures", trusted_keys=[key])
    served = _serve(opened)
    yield openai_client(served), served.card.served_names[0]
    served.shutdown()


@pytest.mark.parametrize(("fields", "message"), [
    ({"logit_bias": {"5": 1}}, "take no logit_bias"),
    ({"logprobs": 2}, "no token-logprobs programs"),
    ({"echo": True, "logprobs": 1, "max_tokens": 0}, "no scored-prefill program"),
])
def test_a_core_prepared_before_these_capabilities_answers_400_naming_them(runner, old_client, fields, message):
    client, name = old_client
    fields = {"max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError, match=message):
        runner.run(client.completions.create(model=name, prompt=[5, 6, 7], **fields))
    plain = runner.run(client.completions.create(model=name, prompt=[5, 6, 7], max_tokens=2, temperature=0))
    assert plain.usage.completion_tokens == 2  # greedy: sampling at the card's temperature could draw the end token

"""Seeded sampling through the whole runtime: a request's tokens depend on its seed and prompt only,
not on which other requests share its batch, and greedy decoding ignores the seed."""

from __future__ import annotations

from helios.runtime.offline import generate
from helios.runtime.records.sampling_params import GREEDY, SamplingParams
from helios.runtime.service import build_runtime

from .test_model_fixture import open_fixture

SAMPLED = SamplingParams.from_packed((1.0, 0.0, 0.95, 0.0, 1.0, 0.0, 0.0), seed=1234)  # temperature 1, top-p 0.95


def run(prompts, sampling=SAMPLED, max_tokens=10):
    return [list(r.token_ids) for r in generate(build_runtime(open_fixture()).engine, prompts, max_tokens,
                                                  sampling=sampling)]


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch():
    prompt = [5, 9, 13, 2]
    (alone,) = run([prompt])
    batched = run([[40, 41, 42], prompt, [7] * 12, [3]])
    assert batched[1] == alone
    assert len(set(map(tuple, batched))) > 1  # other prompts sample other tokens


def test_another_seed_samples_other_tokens():
    prompt = [5, 9, 13, 2]
    first = run([prompt])
    other = run([prompt], SAMPLED.with_seed(99))
    assert first != other


def test_greedy_ignores_the_seed():
    greedy = GREEDY
    assert run([[5, 9]], greedy) == run([[5, 9]], greedy.with_seed(7))

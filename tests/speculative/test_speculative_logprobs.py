"""Token log-probabilities under speculative decoding (token-logprobs twins of SPECULATIVE programs,
`SpeculativeProgram.emitted_logprobs`).

A core whose SPECULATIVE programs have token-logprobs twins keeps speculating for a lane that asks
for log-probabilities; every token a lane emits in a round (accepted proposals and the bonus or
correction token) carries the values a plain DECODE step gives the same token. Greedy requests with
`top_logprobs` on a draft that is the target's first layer (so rounds both accept and reject) give
the tokens and, within float tolerance, the log-probabilities of the same requests without
speculation; a lane with a logit bias too (SPECULATIVE programs apply it; test_speculative_logit_bias.py).
"""

from __future__ import annotations

import math

import pytest

from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3, random_model, write_checkpoint
from runtime.stress import capacity_plan, stress_model

from .support import eager_runtime, truncated

PROMPTS = [[5, 9, 17, 3, 44, 2, 8], [1, 2, 3]]
MAX_TOKENS = 12
TOP = 3


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3), tmp_path_factory.mktemp("llama3")))


def run(recipe, speculative: bool, logit_bias=()):
    model = stress_model(recipe, truncated(recipe, 1), capacity_plan(4))
    engine, counting = eager_runtime(model, SchedulerPolicy(speculative=speculative))
    events: dict[str, list[TokenEvent]] = {}
    for index, prompt in enumerate(PROMPTS):
        request_id = f"r{index}"
        events[request_id] = []
        spec = RequestSpec(request_id, tuple(prompt), MAX_TOKENS, top_logprobs=TOP, logit_bias=logit_bias)
        engine.submit(EngineRequest(spec, lambda e, out=events[request_id]: out.append(e)
                                    if isinstance(e, TokenEvent) else None))
    engine.run_until_idle()
    tokens = {r: [t for e in evs for t in e.token_ids] for r, evs in events.items()}
    logprobs = {r: [lp for e in evs for lp in e.logprobs] for r, evs in events.items()}
    return tokens, logprobs, counting


def test_speculation_returns_the_logprobs_of_plain_decoding(recipe):
    plain_tokens, plain_logprobs, plain = run(recipe, speculative=False)
    tokens, logprobs, counting = run(recipe, speculative=True)
    assert plain.rounds == 0
    assert counting.rounds > 0 and counting.emitted > counting.lanes  # speculated, several tokens a round
    assert tokens == plain_tokens and all(len(t) == MAX_TOKENS for t in tokens.values())
    for request_id, expected in plain_logprobs.items():
        got = logprobs[request_id]
        assert len(got) == len(expected) == MAX_TOKENS
        for mine, theirs in zip(got, expected):
            assert math.isclose(mine.logprob, theirs.logprob, rel_tol=1e-4, abs_tol=1e-4)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top] and len(mine.top) == TOP
            for (_, a), (_, b) in zip(mine.top, theirs.top):
                assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)


def test_a_lane_with_a_logit_bias_and_logprobs_speculates_too(recipe):
    plain_tokens, _, _ = run(recipe, speculative=False, logit_bias=((7, 1.5),))
    tokens, _, counting = run(recipe, speculative=True, logit_bias=((7, 1.5),))
    assert counting.rounds > 0 and tokens == plain_tokens

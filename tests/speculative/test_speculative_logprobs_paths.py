"""Token log-probabilities under speculation on the paths beside greedy decoding
(test_speculative_logprobs.py has greedy lanes and the logit-bias fallback).

Each case runs the same requests through an engine with and without speculation over the same
eager programs (`runtime.stress.stress_model`: SPECULATIVE programs with token-logprobs twins) of
a tiny Llama 2 checkpoint (untied: its outputs vary) and asserts the tokens equal, every emitted
token's log-probability and top alternatives equal within float tolerance, and that speculative
rounds ran (none without speculation):

- sampled lanes (seeded, temperature and top-k) with the target as the draft: the same draws
  as plain decoding (the module docstring of `helios.ignition.speculative`), several tokens a round;
- presence, frequency and repetition penalties, greedy with the first layer as the draft (rounds
  accept and reject) and sampled with the target as the draft: each emitted token is scored with
  the penalty counts of the tokens before it in the round;
- a grammar-constrained lane (a mask that changes at every token) beside a free one: the
  constrained lane takes one token a round, scored under its own mask;
- history drafting (copied proposals) on a repeating prompt;
- requests that score their prompt, and three choices of one prompt (shared prompt pages).
"""

from __future__ import annotations

import math

import pytest
import torch

from helios.contract import StartupOptions
from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, PromptScoresEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA2, random_model, write_checkpoint
from runtime.stress import capacity_plan, stress_model

from .support import Counting, eager_runtime, truncated

PROMPTS = [(5, 9, 17, 3, 44, 2, 8), (1, 2, 3)]
PHRASE = (7, 21, 33, 4, 90, 12, 5, 61)
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=1234)
PENALIZED = SamplingParams(presence_penalty=0.7, frequency_penalty=0.5, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA2), tmp_path_factory.mktemp("llama2")))


class Parity:
    """A grammar allowing even ids at its even tokens and odd ids at its odd ones."""

    def __init__(self):
        self.num_tokens = 0

    def fill_bitmask(self, row: torch.Tensor) -> None:
        allowed = torch.zeros(row.shape[0] * 32, dtype=torch.bool)
        allowed[self.num_tokens % 2::2] = True
        bits = (allowed.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(dim=1)
        row.copy_(torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32))

    def consume_token(self, token_id: int) -> bool:
        taken = token_id % 2 == self.num_tokens % 2
        self.num_tokens += 1
        return taken


def run(recipe, specs, speculative: bool, draft: str = "layer", startup=StartupOptions(), grammars=()):
    """(tokens, logprobs, prompt scores by request, Counting) of `specs` submitted at once."""
    model = stress_model(recipe, recipe if draft == "target" else truncated(recipe, 1), capacity_plan(4), startup)
    engine, counting = eager_runtime(model, SchedulerPolicy(speculative=speculative))
    events = run_to_length(engine, specs, grammars)
    tokens = {r: [t for e in evs if isinstance(e, TokenEvent) for t in e.token_ids] for r, evs in events.items()}
    logprobs = {r: [lp for e in evs if isinstance(e, TokenEvent) for lp in e.logprobs] for r, evs in events.items()}
    scores = {r: [s for e in evs if isinstance(e, PromptScoresEvent) for s in e.scores] for r, evs in events.items()}
    return tokens, logprobs, scores, counting


def run_to_length(engine, specs, grammars=()) -> dict[str, list]:
    """Each spec's events, every spec submitted before the first step (those named in `grammars`
    with a `Parity` grammar), run until idle; each request must end at its output limit."""
    events = {spec.request_id: [] for spec in specs}
    for spec in specs:
        grammar = Parity() if spec.request_id in grammars else None
        engine.submit(EngineRequest(spec, events[spec.request_id].append, grammar=grammar))
    engine.run_until_idle()
    for request_id, received in events.items():
        finishes = [e.reason for e in received if isinstance(e, FinishEvent)]
        assert finishes == [FinishReason.LENGTH], (request_id, received[-1])
    return events


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)


def assert_same_logprobs(recipe, specs, **options) -> Counting:
    plain_tokens, plain_logprobs, plain_scores, plain = run(recipe, specs, False, **options)
    tokens, logprobs, scores, counting = run(recipe, specs, True, **options)
    assert plain.rounds == 0 and counting.rounds > 0
    assert tokens == plain_tokens
    for spec in specs:
        got, expected = logprobs[spec.request_id], plain_logprobs[spec.request_id]
        assert len(got) == len(expected) == spec.max_output_tokens
        for mine, theirs in zip(got, expected):
            assert close(mine.logprob, theirs.logprob), (spec.request_id, mine, theirs)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top] and len(mine.top) == spec.top_logprobs
            assert all(close(a, b) for (_, a), (_, b) in zip(mine.top, theirs.top))
        assert len(scores[spec.request_id]) == len(plain_scores[spec.request_id])
    return counting


CASES = {
    "sampled_target_draft": (
        [RequestSpec(f"r{i}", p, 12, top_logprobs=3, sampling=SAMPLED) for i, p in enumerate(PROMPTS)],
        dict(draft="target")),
    "penalized_greedy": (
        [RequestSpec(f"r{i}", p, 12, top_logprobs=3, sampling=PENALIZED) for i, p in enumerate(PROMPTS)], {}),
    "penalized_sampled_target_draft": (
        [RequestSpec(f"r{i}", p, 12, top_logprobs=2,
                     sampling=SamplingParams(temperature=0.9, presence_penalty=0.7, frequency_penalty=0.5,
                                             repetition_penalty=1.3, seed=7))
         for i, p in enumerate(PROMPTS)], dict(draft="target")),
    "grammar_beside_a_free_lane": (
        [RequestSpec("g", PROMPTS[0], 12, top_logprobs=3, constrained=True),
         RequestSpec("b", PROMPTS[1], 12, top_logprobs=3)], dict(grammars=("g",))),
    "history_drafting": (
        [RequestSpec("h", PHRASE * 4 + PHRASE[:3], 24, top_logprobs=2)],
        dict(startup=StartupOptions(history_drafting=True))),
    "prompt_scores": (
        [RequestSpec(f"s{i}", p, 12, top_logprobs=2, score_prompt=True) for i, p in enumerate(PROMPTS)], {}),
    "choices_of_one_prompt": (
        [RequestSpec(f"n{i}", PROMPTS[0], 12, top_logprobs=2, sampling=SamplingParams(
            temperature=0.9, top_k=20, seed=100 + i)) for i in range(3)], dict(draft="target")),
}


@pytest.mark.parametrize("name", CASES)
def test_speculation_returns_the_logprobs_of_plain_decoding(recipe, name):
    specs, options = CASES[name]
    counting = assert_same_logprobs(recipe, specs, **options)
    assert counting.emitted > counting.lanes  # some lane took several tokens a round

"""Complete speculative generation on two ranks: every rank runs the whole draft, allocates causal
prefixes from rank zero's broadcast confidence and verifies with the sharded target; greedy
tokens equal one rank's ordinary greedy tokens, and a request asking for log-probabilities keeps
speculating (the SPECULATIVE programs' token-logprobs twins) and gets the values one rank's plain
decoding returns; so do lanes with a logit bias (the SPECULATIVE programs add it to the gathered
target logits)."""

from __future__ import annotations

import math

import pytest

from helios.cli.main import main
from helios.runtime.engine import EngineRequest
from helios.runtime.offline import generate
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from ignition.hf_checkpoints import QWEN3
from speculative.support import Counting, write_truncated_checkpoint

from .conftest import MAX_TOKENS, NAMESPACE, PROMPTS, running


@pytest.fixture(scope="module")
def draft_core(cores):
    checkpoint = cores.checkpoint(QWEN3)
    draft = write_truncated_checkpoint(checkpoint, cores.root / "qwen3-draft", 1)
    core = cores.root / "qwen3-draft-tp2.core"
    assert main([
        "prepare", str(checkpoint), "-o", str(core), "--key", str(cores.key), "--namespace", NAMESPACE,
        "--context-tokens", "64", "--prefill-tokens", "16", "--decode-batches", "2", "--no-mixed",
        "--draft", str(draft), "--speculative-widths", "1,4", "--allocate-prefixes", "--packed-per-lane", "2",
        "--tensor-parallel", "2",
    ]) == 0
    return core


def test_two_ranks_speculate_what_one_rank_decodes(cores, draft_core):
    counting = Counting()
    with running(cores.open(draft_core)) as runtime:
        counting.wrap(runtime.engine.executor)
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    assert [r.finish_reason.name for r in results] == ["LENGTH"] * len(PROMPTS), [r.message for r in results]
    assert [list(r.token_ids) for r in results] == cores.reference_tokens(QWEN3)
    assert counting.rounds > 0 and counting.accepted > 0  # allocation ran on broadcast confidence


def logprob_run(runtime, specs):
    """Each request's tokens and token log-probabilities (all submitted at once; each ends by its length)."""
    events = {spec.request_id: [] for spec in specs}
    for spec in specs:
        runtime.engine.submit(EngineRequest(spec, events[spec.request_id].append))
    runtime.engine.run_until_idle()
    for received in events.values():
        assert [e.reason for e in received if isinstance(e, FinishEvent)] == [FinishReason.LENGTH], received[-1]
    tokens = {r: [t for e in evs if isinstance(e, TokenEvent) for t in e.token_ids] for r, evs in events.items()}
    logprobs = {r: [lp for e in evs if isinstance(e, TokenEvent) for lp in e.logprobs] for r, evs in events.items()}
    return tokens, logprobs


def one_rank_and_two_speculating(cores, draft_core, specs):
    """(`logprob_run` of `specs` on one rank decoding plainly, the same on the two-rank draft core,
    the draft core's `Counting`)."""
    with running(cores.open(cores.core(QWEN3, 1))) as runtime:
        plain = logprob_run(runtime, specs)
    counting = Counting()
    with running(cores.open(draft_core)) as runtime:
        counting.wrap(runtime.engine.executor)
        speculated = logprob_run(runtime, specs)
    return plain, speculated, counting


def test_two_ranks_speculate_with_the_logprobs_one_rank_decodes(cores, draft_core):
    # greedy lanes and penalized ones (each token scored with the counts of the round's tokens before it)
    penalized = SamplingParams(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3)
    specs = [RequestSpec(f"g{i}", tuple(p), MAX_TOKENS, top_logprobs=3) for i, p in enumerate(PROMPTS)]
    specs += [RequestSpec("p", tuple(PROMPTS[2]), MAX_TOKENS, top_logprobs=2, sampling=penalized)]
    (expected_tokens, expected), (tokens, logprobs), counting = one_rank_and_two_speculating(cores, draft_core, specs)
    assert counting.rounds > 0 and counting.accepted > 0
    assert tokens == expected_tokens
    for spec in specs:
        got, want = logprobs[spec.request_id], expected[spec.request_id]
        assert len(got) == len(want) == MAX_TOKENS
        for mine, theirs in zip(got, want):
            assert math.isclose(mine.logprob, theirs.logprob, rel_tol=1e-4, abs_tol=1e-4), (mine, theirs)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top] and len(mine.top) == spec.top_logprobs


def test_two_ranks_speculate_biased_lanes_as_one_rank_decodes(cores, draft_core):
    # a nudge with a ban, a bias that forces a token, an unbiased lane beside them
    biases = (((7, 3.0), (11, -100.0)), ((42, 100.0),), ())
    specs = [RequestSpec(f"b{i}", tuple(p), MAX_TOKENS, top_logprobs=2, logit_bias=bias)
             for i, (p, bias) in enumerate(zip(PROMPTS, biases))]
    (expected_tokens, expected), (tokens, logprobs), counting = one_rank_and_two_speculating(cores, draft_core, specs)
    assert counting.rounds > 0 and counting.accepted > 0
    assert all(counting.speculated[spec.request_id] > 0 for spec in specs)  # the biased lanes too
    assert tokens == expected_tokens and tokens["b1"] == [42] * MAX_TOKENS
    for spec in specs:
        for mine, theirs in zip(logprobs[spec.request_id], expected[spec.request_id], strict=True):
            assert math.isclose(mine.logprob, theirs.logprob, rel_tol=1e-4, abs_tol=1e-4), (mine, theirs)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top]

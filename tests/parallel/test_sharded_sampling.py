"""Two tensor-parallel ranks, each sampling from its own vocabulary rows, draw what one rank draws:
seeded sampling with top-k/top-p/min-p, penalties and logit bias (ids in both ranks' rows), greedy
rows beside them, and the log-probabilities with their alternatives, for a dense family (and a
mixture-of-experts one in HELIOS_FAMILY_RANK_SWEEP; greedy tokens of every family: test_families)."""

from __future__ import annotations

import math

import pytest

from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import LLAMA3, QWEN3, QWEN3_MOE
from support.chat_checkpoint import VOCAB_SIZE
from support.sweeps import in_sweep

from .conftest import FAST, PROMPTS

REQUESTS = (  # (sampling, logit bias, top logprobs) per prompt of PROMPTS
    (SamplingParams(temperature=0.9, top_k=20, seed=11), ((7, 2.5), (VOCAB_SIZE - 9, 3.0)), 3),
    (SamplingParams(temperature=1.2, top_p=0.9, min_p=0.02, repetition_penalty=1.2, frequency_penalty=0.3,
                    seed=-5), (), None),
    (SamplingParams(presence_penalty=0.5), ((VOCAB_SIZE - 2, 1.0),), 2),  # greedy, penalised
)


def sampled_run(core, options: RuntimeOptions | None = None) -> tuple[dict, set]:
    """(request id -> (tokens, [(logprob, top alternatives)] or None), all requests in one batch;
    the names of the programs' outputs). `options`: the runtime's (default: the CPU, ranks as threads)."""
    events: dict[str, list[TokenEvent]] = {}
    runtime = build_runtime(core, options or RuntimeOptions(ranks=FAST))
    try:
        outputs = {name for program in runtime.model.programs for name in program.outputs}
        for index, (prompt, (sampling, bias, top)) in enumerate(zip(PROMPTS, REQUESTS)):
            spec = RequestSpec(f"r{index}", tuple(prompt), 10, sampling=sampling, logit_bias=bias, top_logprobs=top)
            events[spec.request_id] = []
            runtime.engine.submit(EngineRequest(spec, lambda event, r=spec.request_id: events[r].append(event)))
        runtime.engine.run_until_idle()
    finally:
        runtime.close()
    results = {}
    for request_id, seen in events.items():
        tokens = [t for event in seen if isinstance(event, TokenEvent) for t in event.token_ids]
        scores = [s for event in seen if isinstance(event, TokenEvent) and event.logprobs for s in event.logprobs]
        assert len(tokens) == 10, seen[-1]
        results[request_id] = (tokens, scores or None)
    return results, outputs


# Qwen3 (a second dense family: each rank samples from its vocabulary rows as under Llama 3) and Qwen3-MoE (its
# experts change nothing of the sampling over the rows; test_stress_ranks' qwen3_moe case draws seeded requests with
# log-probabilities on its two ranks against one) only with HELIOS_FAMILY_RANK_SWEEP=1.
@pytest.mark.parametrize("family", in_sweep("HELIOS_FAMILY_RANK_SWEEP", (LLAMA3,), (QWEN3_MOE, QWEN3)),
                         ids=lambda family: family.name)
def test_two_ranks_sample_and_score_what_one_rank_does(cores, family):
    one, one_outputs = sampled_run(cores.open(cores.core(family, 1)))
    two, two_outputs = sampled_run(cores.open(cores.core(family, 2)))
    assert "logits" in one_outputs and "shard_logits" not in one_outputs
    assert "shard_logits" in two_outputs and "logits" not in two_outputs  # the ranks never assembled the rows
    assert {r: tokens for r, (tokens, _) in two.items()} == {r: tokens for r, (tokens, _) in one.items()}
    assert one["r1"][1] is None and two["r1"][1] is None
    for request_id in ("r0", "r2"):
        for mine, theirs in zip(two[request_id][1], one[request_id][1], strict=True):
            assert math.isclose(mine.logprob, theirs.logprob, abs_tol=1e-5)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top]
            # Two ranks add a row-parallel product's halves, one rank sums them whole: the float32
            # logits differ in their last bits, an alternative's log-probability (about -5 to -10,
            # ulp 1e-6) by up to about ten ulps (measured 9.5e-6 through MKL's sgemm, 1.1e-5 through
            # the packed projection kernel: `helios.runtime.loading.linear_kernel`).
            assert all(math.isclose(a, b, abs_tol=2e-5) for (_, a), (_, b) in zip(mine.top, theirs.top))

"""Speculation under hostile cohorts: served behaviour that the differential tests do not reach.

A SPECULATIVE program narrower than the decode cohort (`helios prepare --speculative-batches`
below the decode batches): it took the first lanes in scheduling order round after round, each until
it ended, and left the others without a token meanwhile (ten lanes beside two-row programs: the
last waited for eight whole outputs, and the cohort took about twice plain decoding's steps). Such a
cohort now decodes plainly, every lane a step; once it fits the program it speculates, its lanes
with their full share of the packed capacity. The tokens stay those of plain decoding.

Penalties under preemption: a request with presence, frequency or repetition penalties that is
preempted (recomputed or offloaded) and readmitted keeps counting the outputs it had before, so a
server short of pages speculates exactly the tokens an ample one decodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.engine import EngineRequest
from helios.runtime.offline import generate
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3, random_model, write_checkpoint

from .support import eager_model, eager_runtime, truncated

UNUSED = Path("draft-is-given-directly")
# ten lanes: each program's reservation for the lanes without rows (10 - 1 > P = 4, and > B x W = 8 allocating)
# once skipped the first ones; one prefill step holds every prompt. The first two outlive the rest by far.
PROMPTS = [[5 + i, 17, 3 * i] for i in range(10)]
MAX_TOKENS = [24, 24] + [8] * 8


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3), tmp_path_factory.mktemp("llama3")))


def narrow_plan(allocate: bool) -> CapacityPlan:
    # two SPECULATIVE rows of P = 2 a lane beside decode batches of ten
    speculative = SpeculativePlan(UNUSED, widths=(4,), batches=(2,), allocate_prefixes=allocate, packed_per_lane=2)
    return CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=32, decode_batches=(1, 10),
                        speculative=speculative)


def narrow_run(engine) -> list[list[int]]:
    """Each prompt's tokens (up to its `MAX_TOKENS`)."""
    tokens: dict[str, list[int]] = {}

    def on_event(event) -> None:
        if isinstance(event, TokenEvent):
            tokens.setdefault(event.request_id, []).extend(event.token_ids)

    ids = [f"r{index}" for index in range(len(PROMPTS))]
    for request_id, prompt, limit in zip(ids, PROMPTS, MAX_TOKENS):
        engine.submit(EngineRequest(RequestSpec(request_id, tuple(prompt), limit), on_event))
    engine.run_until_idle()
    return [tokens[r] for r in ids]


@pytest.mark.parametrize("allocate", [False, True], ids=["exact-lengths", "allocating"])
def test_a_cohort_wider_than_the_speculative_program_decodes_every_lane(recipe, allocate):
    draft = truncated(recipe, 1)
    plain, _ = eager_runtime(eager_model(recipe, draft, narrow_plan(allocate)), SchedulerPolicy(speculative=False))
    expected = narrow_run(plain)
    engine, counting = eager_runtime(eager_model(recipe, draft, narrow_plan(allocate)))
    scheduler = engine.scheduler
    rounds = []  # (the round's request ids, the decoding requests' ids in scheduling order, the lanes' ceilings)
    steps = []  # every decoding step's rows
    launch = engine.executor.launch

    def recorded(plan, **kwargs):
        if plan.operation.name in ("DECODE", "SPECULATIVE"):
            steps.append(len(plan.rows))
        if plan.operation.name == "SPECULATIVE":  # (one frame: nothing else in flight, prompts all sampled)
            running = (r for r in scheduler.queues.running if r.num_output_tokens > 0)
            decoding = sorted(running, key=lambda r: r.order_key)
            rounds.append(([row.request_id for row in plan.rows], [r.request_id for r in decoding],
                           [row.token_ceiling for row in plan.rows]))
        return launch(plan, **kwargs)

    engine.executor.launch = recorded
    assert narrow_run(engine) == expected
    assert rounds and counting.accepted > 0
    assert steps[0] == len(PROMPTS)  # the whole cohort decodes at once, plainly
    for lanes, decoding, _ in rounds:  # a round leaves no decoding lane without a row
        assert lanes == decoding, (lanes, decoding)
    _, _, first_ceilings = rounds[0]
    assert sum(first_ceilings) >= 4  # P = 4: the packed capacity is the lanes', none kept for lanes without rows


PENALISED = SamplingParams(presence_penalty=0.8, frequency_penalty=0.3, repetition_penalty=1.2)


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD], ids=lambda mode: mode.name.lower())
def test_penalties_count_the_outputs_before_a_preemption(recipe, mode):
    draft = truncated(recipe, 1)
    speculative = SpeculativePlan(UNUSED, widths=(4,))
    capacity = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=32, decode_batches=(1, 4),
                            speculative=speculative)
    prompts = [[7 * i + 3, 11, 29 + i, 2, 40 - i, 5] * 3 for i in range(5)]
    ample, _ = eager_runtime(eager_model(recipe, draft, capacity), SchedulerPolicy(speculative=False))
    expected = generate(ample, prompts, 30, sampling=PENALISED)
    assert ample.scheduler.counters().preemptions == 0
    unpenalised, _ = eager_runtime(eager_model(recipe, draft, capacity), SchedulerPolicy(speculative=False))
    assert [g.token_ids for g in generate(unpenalised, prompts, 30)] != [g.token_ids for g in expected]
    # 16 pages of 4 tokens for five requests of up to 48 positions: they take turns
    short_model = eager_model(recipe, draft, capacity, num_pages=16)
    short, counting = eager_runtime(short_model, SchedulerPolicy(preemption=mode), host_pages=32)
    generated = generate(short, prompts, 30, sampling=PENALISED)
    assert short.scheduler.counters().preemptions > 0 and counting.accepted > 0
    assert [g.token_ids for g in generated] == [g.token_ids for g in expected]

"""Sampled lanes on a core that allocates prefixes on the device keep the target's distribution.

`helios::allocate_prefixes` admits a lane's proposal j by the draft's confidence in it, which for a
sampled lane is a function of the draw that proposed it. Where the lanes' ceilings exceed P and
they compete for it, verifying a drawn proposal only when it came out likely (and drawing the bonus
after the last verified position with the uniform that drew the first one left out) skews the
lane's tokens: test_distribution.py's rig, its program allocating with P = 1.6 positions a lane for
ceilings of 3 at temperature 2, emitted first tokens whose frequencies were up to 0.07 off the exact
marginal (0.03 against 0.11 for one token). A round holding a lane with drawn proposals therefore
keeps its ceilings within P, which the allocation grants whole; greedy lanes still compete
(test_equivalence.py's test_device_allocation_within_a_smaller_packed_capacity). Here, through the
engine, every such round stays within P and the second output token (the first a round emits)
follows the exact marginal.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from helios.contract import StartupOptions
from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint

from .support import eager_model, eager_runtime, truncated
from .test_distribution import PENDING, PROMPT, TINY, exact_distributions

UNUSED = Path("draft-is-given-directly")
LANES = 16  # one decode cohort: ceilings of 4 a lane against P = 2 a lane
REQUESTS = 512
TOLERANCE = 0.06  # the second token's frequencies over 512 requests: standard errors up to 0.022
TEMPERATURE = 2.0  # no filters: the target's and the unrelated draft's orders differ widely


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    target, draft = random_model(TINY, seed=0), random_model(TINY, seed=1)
    return target, load_checkpoint(write_checkpoint(target, tmp_path_factory.mktemp("target"))), \
        load_checkpoint(write_checkpoint(draft, tmp_path_factory.mktemp("draft")))


def allocating_plan() -> CapacityPlan:
    speculative = SpeculativePlan(UNUSED, widths=(4,), allocate_prefixes=True, packed_per_lane=2)
    return CapacityPlan(page_tokens=4, context_tokens=16, prefill_tokens=16, decode_batches=(LANES,),
                        speculative=speculative)


def test_sampled_lanes_keep_the_target_distribution_under_prefix_allocation(references):
    reference, target, draft = references
    engine, counting = eager_runtime(eager_model(target, draft, allocating_plan()))
    rounds = []  # per SPECULATIVE plan: (the lanes' ceilings summed, P)
    launch = engine.executor.launch

    def recorded(plan, **kwargs):
        if plan.operation.name == "SPECULATIVE":
            rounds.append((sum(row.token_ceiling for row in plan.rows), plan.variant.packed_token_capacity))
        return launch(plan, **kwargs)

    engine.executor.launch = recorded
    tokens: dict[str, list[int]] = {}

    def on_event(event) -> None:
        if isinstance(event, TokenEvent):
            tokens[event.request_id].extend(event.token_ids)

    for index in range(REQUESTS):  # fresh seeds (not pinned): the requests speculate
        request_id = f"r{index}"
        tokens[request_id] = []
        sampling = SamplingParams(temperature=TEMPERATURE, seed=1000 + index)
        engine.submit(EngineRequest(RequestSpec(request_id, (*PROMPT, PENDING), 5, sampling=sampling), on_event))
    engine.run_until_idle()
    assert rounds and counting.accepted > 0
    assert all(ceilings <= capacity for ceilings, capacity in rounds), rounds[:4]
    second = torch.tensor([tokens[f"r{index}"][1] for index in range(REQUESTS)])
    _, exact = exact_distributions(reference, (TEMPERATURE, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0))
    observed = torch.bincount(second, minlength=exact.shape[0]).double() / REQUESTS
    assert (observed - exact).abs().max() < TOLERANCE, (observed, exact)


# -- a bounded randomized differential: speculation on and off --------------------------------------
# (session 68's hunt drew 4,400 such workloads over Llama 3, Llama 2, Qwen2, gpt-oss, Gemma 3 and
# DeepSeek-V3, with two execution frames, logit bias, stop sequences and prefix reuse too: none differed)

FUZZ_SEEDS = (3, 11, 29)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3_UNTIED), tmp_path_factory.mktemp("llama3_untied")))


def drawn_workload(rng) -> tuple[CapacityPlan, list[RequestSpec], dict]:
    """A plan (width, allocation, P a lane, page size, decode batches) and a batch of requests of
    different lengths: greedy, penalised greedy and pinned-seed sampled, with EOS ids, output limits
    inside and past a round, repeated phrases (history drafting) and shared prefixes; page-short
    caches preempt."""
    width = rng.choice([2, 3, 4])
    allocate = rng.random() < 0.5
    speculative = SpeculativePlan(UNUSED, widths=(width,), allocate_prefixes=allocate,
                                  packed_per_lane=rng.choice([None, 2]))
    page_tokens = rng.choice([4, 8])
    plan = CapacityPlan(page_tokens=page_tokens, context_tokens=64, prefill_tokens=32,
                        decode_batches=rng.choice([(1, 4), (2, 8)]), speculative=speculative)
    phrase = [rng.randrange(120) for _ in range(rng.randint(2, 6))]
    shared = [rng.randrange(120) for _ in range(12)]
    specs = []
    for index in range(6):
        prompt = rng.choice([phrase * 4, shared + [rng.randrange(120)], [rng.randrange(120) for _ in range(9)]])
        eos = frozenset(rng.sample(range(128), rng.choice([0, 3, 8])))
        pinned = rng.random() < 0.3
        sampling = (SamplingParams(temperature=1.0, top_k=rng.choice([0, 5]), seed=rng.randrange(2**40)) if pinned
                    else SamplingParams(repetition_penalty=rng.choice([1.0, 1.3]),
                                        frequency_penalty=rng.choice([0.0, 0.5])))
        specs.append(RequestSpec(f"r{index}", tuple(prompt[:30]), rng.choice([1, 3, 5, 9, 20]), eos,
                                 sampling=sampling, pinned_seed=pinned))
    options = dict(history=rng.random() < 0.5, num_pages=rng.choice([None, 64 // page_tokens + 4]))
    return plan, specs, options


def generated(recipe, plan, specs, options, speculative: bool):
    """Each request's tokens and finish reason, and the speculative rounds' counts."""
    model = eager_model(recipe, truncated(recipe, 1), plan, StartupOptions(history_drafting=options["history"]),
                        num_pages=options["num_pages"])
    engine, counting = eager_runtime(model, SchedulerPolicy(speculative=speculative), host_pages=32)
    out: dict[str, list] = {spec.request_id: [[], None] for spec in specs}

    def on_event(event) -> None:
        if isinstance(event, TokenEvent):
            out[event.request_id][0].extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            out[event.request_id][1] = event.reason.name

    for spec in specs:
        engine.submit(EngineRequest(spec, on_event))
    engine.run_until_idle()
    return out, counting


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_greedy_and_pinned_seed_requests_answer_the_same_with_speculation_off(llama, seed):
    plan, specs, options = drawn_workload(random.Random(seed))
    expected, _ = generated(llama, plan, specs, options, speculative=False)
    got, counting = generated(llama, plan, specs, options, speculative=True)
    assert got == expected
    assert counting.rounds > 0
    for spec in specs:
        assert len(got[spec.request_id][0]) <= spec.max_output_tokens
        assert got[spec.request_id][1] in ("EOS", "LENGTH")

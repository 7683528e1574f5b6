"""Seeded randomized soak: arrivals, cancellations, host stops, failures, a cache too small."""

from __future__ import annotations

import random

import pytest

from helios.errors import AdmissionRejected
from helios.runtime.events import FinishReason
from helios.runtime.plan import RowResult
from helios.runtime.policy import PreemptionMode, SchedulerPolicy

from .fake_model import reference
from .harness import assert_all_released, make, spec

CONFIGS = [
    dict(seed=11, policy=SchedulerPolicy(), options=dict(max_active=8, num_pages=40)),
    dict(seed=12, policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD),
         options=dict(max_active=16, num_pages=48, host_slots=24, rows=4)),
    dict(seed=13, policy=SchedulerPolicy(offload_watermark_pages=12),
         options=dict(max_active=8, num_pages=40, mixed=False, speculative=(2, 3), draft_lag=0)),
    dict(seed=14, policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD, two_frames=False),
         options=dict(max_active=6, num_pages=48, stateful=True, host_slots=40)),
]


def random_request(rng: random.Random, index: int, shared: list[list[int]], turns: list[list[int]]):
    """Prompts share prefixes; some continue a finished conversation (prompt + output + more)."""
    if turns and rng.random() < 0.2:
        prefix = rng.choice(turns[-3:])
    else:
        prefix = rng.choice(shared)[: rng.randrange(0, 24)] if rng.random() < 0.6 else []
    prompt = prefix + [rng.randrange(1, 97) for _ in range(rng.randrange(1, 30))]
    options = dict(priority=rng.choice([0, 0, 0, 1, 2]), eos_ids=frozenset({3}) if rng.random() < 0.5 else frozenset(),
                   publish_snapshot=rng.random() < 0.3, observe=rng.random() < 0.2)
    kind = rng.random()
    if kind < 0.1:
        options["constrained"] = True
    elif kind < 0.2:
        options["stop_token_sequences"] = ((rng.randrange(1, 97),),)
    elif kind < 0.25:
        options["score_prompt"] = True
    max_output = rng.randrange(1, 40) if rng.random() > 0.03 else 400  # some exceed the context
    return spec(f"q{index}", prompt, max_output, **options)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"seed{c['seed']}")
def test_soak(config):
    rng = random.Random(config["seed"])
    stateful = config["options"].get("stateful", False)
    scheduler, driver = make(config["policy"], queue=40, **config["options"])
    shared = [[rng.randrange(1, 97) for _ in range(24)] for _ in range(4)]
    specs, rejected, rejection_kinds = {}, set(), set()
    barrier_violations = []

    turns: list[list[int]] = []

    def on_events(events):
        for event in events:
            item = specs[event.request_id]
            outcome = driver.outcomes[event.request_id]
            if outcome.finish is not None and outcome.finish.reason == FinishReason.LENGTH:
                turns.append(list(item.prompt_ids) + outcome.tokens)
            stops = {seq[0] for seq in item.stop_token_sequences}
            if outcome.finish is None and stops & set(outcome.tokens):
                driver.stop(event.request_id)

    driver.fail_next = lambda plan: bool(plan.rows) and rng.random() < 0.004
    submitted = 0
    for _ in range(20_000):
        if submitted < 300 and rng.random() < 0.08:
            item = random_request(rng, submitted, shared, turns)
            submitted += 1
            specs[item.request_id] = item
            try:
                driver.submit(item)
            except AdmissionRejected as error:
                rejected.add(item.request_id)
                rejection_kinds.add(type(error).__name__)
        if rng.random() < 0.04 and driver.outcomes:
            driver.cancel(rng.choice(list(driver.outcomes)))
        feedback = any(r.spec.needs_feedback for r in scheduler.queues.running)
        inflight = scheduler.num_inflight
        if not driver.step(on_events) and submitted >= 300:
            break
        if feedback and scheduler.num_inflight == 2 and inflight == 1:
            barrier_violations.append(driver.plans[-1].sequence)
        if rng.random() < 0.005 and driver.inflight:
            corrupt_oldest(driver, rng)
    driver.run(on_events)

    assert not barrier_violations
    assert submitted == 300 and 0 < len(rejected) < 60, rejection_kinds
    assert "ContextExceeded" in rejection_kinds
    reasons = {reason: 0 for reason in FinishReason}
    for request_id, item in specs.items():
        outcome = driver.outcomes.get(request_id)
        if request_id in rejected:
            assert outcome is None or outcome.num_finishes == 0
            continue
        assert outcome.num_finishes == 1, request_id
        reasons[outcome.finish.reason] += 1
        expected = reference(item.prompt_ids, item.max_output_tokens, item.eos_ids, stateful)
        if outcome.finish.reason in (FinishReason.EOS, FinishReason.LENGTH):
            assert outcome.tokens == expected, request_id
        else:
            assert outcome.tokens == expected[: len(outcome.tokens)], request_id
        assert all((e.observed_ns is not None) == item.observe for e in outcome.token_events)
    for reason in (FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.ERROR, FinishReason.STOP):
        assert reasons[reason] > 0, reason
    counters = scheduler.counters()
    assert counters.preemptions > 0 and counters.constrained_max_inflight == 1
    assert counters.prefix_reused_tokens > 0 and counters.snapshots_published > 0
    assert_all_released(scheduler)
    scheduler.check_invariants()


def corrupt_oldest(driver, rng):
    """Replace the oldest in-flight results with a record that must fail validation."""
    plan, results = driver.inflight[0]
    if not results:
        return
    index = rng.randrange(len(results))
    bad = results[index]._replace(generation=results[index].generation + 1)
    driver.inflight[0] = (plan, results[:index] + [bad] + results[index + 1:])


def test_soak_leaves_running_requests_intact_after_failures():
    """A failed plan ends only its own lanes; the others finish with reference output."""
    scheduler, driver = make(max_active=4, num_pages=64)
    driver.submit(spec("a", range(1, 9), 6), spec("b", range(20, 30), 6))
    driver.step()  # prefill of a and b in flight
    driver.submit(spec("c", range(40, 45), 6))
    plan, results = driver.inflight.popleft()
    events = scheduler.fail(plan, "device lost")
    driver.record(events)
    assert {e.request_id for e in events} == {"a", "b"}
    assert all(e.reason == FinishReason.ERROR and e.message == "device lost" for e in events)
    outcomes = driver.run()
    assert outcomes["c"].tokens == reference(range(40, 45), 6)
    # only c's two complete pages were published: the failed prefill of a and b published nothing
    assert scheduler.view("a") is None and scheduler.counters().pages_cached == 2
    assert_all_released(scheduler)

"""Seeded randomized soak: arrivals, cancellations, host stops, failures, a cache too small."""

from __future__ import annotations

import random

import pytest

from helios.errors import AdmissionRejected
from helios.runtime.records.capacities import LengthSource
from helios.runtime.records.events import FinishReason
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy

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


class Soak:
    """Random arrivals, cancellations, host stops, failed executions and corrupt records."""

    def __init__(self, config, num_requests: int = 300):
        self.rng = random.Random(config["seed"])
        self.stateful = config["options"].get("stateful", False)
        self.scheduler, self.driver = make(config["policy"], queue=40, **config["options"])
        self.driver.fail_next = lambda plan: bool(plan.rows) and self.rng.random() < 0.004
        self.num_requests = num_requests
        self.shared = [[self.rng.randrange(1, 97) for _ in range(24)] for _ in range(4)]
        self.turns: list[list[int]] = []
        self.specs, self.rejected, self.rejection_kinds = {}, set(), set()
        self.barrier_violations: list[int] = []

    def run(self) -> None:
        rng, driver, scheduler = self.rng, self.driver, self.scheduler
        while True:
            if len(self.specs) < self.num_requests and rng.random() < 0.08:
                self.arrive()
            if rng.random() < 0.04 and driver.outcomes:
                driver.cancel(rng.choice(list(driver.outcomes)))
            feedback = any(r.spec.needs_feedback for r in scheduler.queues.running)
            inflight = scheduler.num_inflight
            if not driver.step(self.on_events) and len(self.specs) >= self.num_requests:
                break
            if feedback and scheduler.num_inflight == 2 and inflight == 1:
                self.barrier_violations.append(driver.plans[-1].sequence)
            if rng.random() < 0.005 and driver.inflight:
                corrupt_oldest(driver, rng)
        driver.run(self.on_events)

    def arrive(self) -> None:
        item = random_request(self.rng, len(self.specs), self.shared, self.turns)
        self.specs[item.request_id] = item
        try:
            self.driver.submit(item)
        except AdmissionRejected as error:
            self.rejected.add(item.request_id)
            self.rejection_kinds.add(type(error).__name__)

    def on_events(self, events) -> None:
        """The frontend's part: resolve host stops; remember finished turns to continue."""
        for event in events:
            item = self.specs[event.request_id]
            outcome = self.driver.outcomes[event.request_id]
            if outcome.finish is not None and outcome.finish.reason == FinishReason.LENGTH:
                self.turns.append(list(item.prompt_ids) + outcome.tokens)
            stops = {seq[0] for seq in item.stop_token_sequences}
            if outcome.finish is None and stops & set(outcome.tokens):
                self.driver.stop(event.request_id)

    def check_outcomes(self) -> dict[FinishReason, int]:
        """Exactly one terminal event each; natural ends match the reference, others a prefix."""
        reasons = {reason: 0 for reason in FinishReason}
        for request_id, item in self.specs.items():
            outcome = self.driver.outcomes.get(request_id)
            if request_id in self.rejected:
                assert outcome is None or outcome.num_finishes == 0
                continue
            assert outcome.num_finishes == 1, request_id
            reasons[outcome.finish.reason] += 1
            expected = reference(item.prompt_ids, item.max_output_tokens, item.eos_ids, self.stateful)
            if outcome.finish.reason in (FinishReason.EOS, FinishReason.LENGTH):
                assert outcome.tokens == expected, request_id
            else:
                assert outcome.tokens == expected[: len(outcome.tokens)], request_id
            assert all((e.observed_ns is not None) == item.observe for e in outcome.token_events)
        return reasons


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"seed{c['seed']}")
def test_soak(config):
    soak = Soak(config)
    soak.run()
    assert not soak.barrier_violations
    assert 0 < len(soak.rejected) < 60, soak.rejection_kinds
    assert "ContextExceeded" in soak.rejection_kinds
    reasons = soak.check_outcomes()
    for reason in (FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.ERROR, FinishReason.STOP):
        assert reasons[reason] > 0, reason
    counters = soak.scheduler.counters()
    assert counters.preemptions > 0 and counters.constrained_max_inflight == 1
    assert counters.prefix_reused_tokens > 0 and counters.snapshots_published > 0
    assert_all_released(soak.scheduler)
    soak.scheduler.check_invariants()


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


def random_config(seed: int) -> dict:
    """A small random geometry and policy (speculation only on paged layouts: the fake model's
    speculative program keeps no recurrent state)."""
    rng = random.Random(seed)
    page_tokens = rng.choice([1, 2, 3, 4, 8])
    options = dict(max_active=rng.choice([1, 2, 3, 4, 8]), page_tokens=page_tokens,
                   num_pages=rng.randrange(3 * (60 // page_tokens), 8 * (60 // page_tokens) + 8),
                   mixed=rng.random() < 0.6, rows=rng.choice([0, 1, 4]), host_slots=rng.choice([0, 4, 64]),
                   stateful=rng.random() < 0.25, prefill_tokens=rng.choice([16, 32, 64]),
                   context=rng.choice([128, 256]))
    if rng.random() < 0.3 and not options["stateful"]:
        options.update(speculative=(rng.randrange(0, 4), rng.randrange(1, 5)),
                       length_source=rng.choice([LengthSource.QUERY_LENGTH, LengthSource.PREFIX_LIMIT]),
                       draft_lag=rng.choice([None, 0, 1, 3]))
    policy = SchedulerPolicy(preemption=rng.choice(list(PreemptionMode)), prefix_caching=rng.random() < 0.8,
                             two_frames=rng.random() < 0.7, offload_watermark_pages=rng.choice([0, 0, 6]))
    return dict(seed=seed, policy=policy, options=options)


@pytest.mark.parametrize("seed", range(100, 108))
def test_random_geometries_and_policies(seed):
    soak = Soak(random_config(seed), num_requests=40)
    soak.run()
    assert not soak.barrier_violations
    soak.check_outcomes()
    assert_all_released(soak.scheduler)
    soak.scheduler.check_invariants()

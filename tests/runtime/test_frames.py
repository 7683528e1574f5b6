"""Two execution frames, the feedback barrier, cancellation and host stops."""

from __future__ import annotations

import dataclasses

import pytest

from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import FakeExecutor, reference
from .harness import Driver, assert_all_released, capacities, make, spec


def decoding(driver, *items):
    """Submit and prefill `items`; returns the scheduler with every lane decoding."""
    driver.submit(*items)
    plan = driver.scheduler.schedule()
    driver.record(driver.scheduler.complete(plan, driver.executor.run(plan)))
    return driver.scheduler


def launch(driver):
    plan = driver.scheduler.schedule()
    if plan is not None:
        driver.inflight.append((plan, driver.executor.run(plan)))
        driver.plans.append(plan)
    driver.scheduler.check_invariants()
    return plan


def finish_oldest(driver):
    plan, results = driver.inflight.popleft()
    events = driver.scheduler.complete(plan, results)
    driver.record(events)
    driver.scheduler.check_invariants()
    return events


def test_plain_decode_rounds_occupy_both_frames():
    scheduler, driver = make(max_active=4, page_tokens=4)
    decoding(driver, spec("a", range(1, 8), 6), spec("b", range(10, 13), 6))
    first, second = launch(driver), launch(driver)
    assert launch(driver) is None  # at most two in flight
    assert first.operation == second.operation == Operation.DECODE and {first.frame, second.frame} == {0, 1}
    a0, a1 = first.rows[0], second.rows[0]
    assert a1.pending_on_device and a1.token_ids == () and not a0.pending_on_device
    assert (a1.start_pos, a1.sample_index) == (a0.start_pos + 1, a0.sample_index + 1)
    # page 1 holds positions 4..7; only the second frame's position 8 needs a new entry
    assert (a0.start_pos, a0.new_page_ids) == (7, ()) and a1.page_table_start == 2 and len(a1.new_page_ids) == 1
    finish_oldest(driver)
    assert launch(driver).rows[0].start_pos == a1.start_pos + 1  # a third round rides behind the second
    driver.run()
    assert driver.max_inflight == 2
    assert driver.outcomes["a"].tokens == reference(range(1, 8), 6)
    assert driver.outcomes["b"].tokens == reference(range(10, 13), 6)


@pytest.mark.parametrize("options", [dict(constrained=True), dict(stop_strings=("x",)),
                                     dict(stop_token_sequences=((5, 6),))])
def test_feedback_requests_keep_one_round_outstanding(options):
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 6), spec("g", range(20, 25), 6, **options))
    assert launch(driver) is not None and launch(driver) is None
    driver.run()
    assert driver.max_inflight == 1
    if options.get("constrained"):
        assert scheduler.counters().constrained_max_inflight == 1
        assert scheduler.counters().mixed_grammar_decode_plans > 0


def test_phase_changes_and_copies_wait_for_feedback():
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 6))
    driver.submit(spec("late", [1, 2, 3], 2))  # an admission is possible: no second frame
    plan = launch(driver)
    assert plan.operation == Operation.MIXED and launch(driver) is None
    finish_oldest(driver)
    assert launch(driver).operation == Operation.DECODE
    assert launch(driver) is not None  # nothing left to admit: both frames again
    driver.run()
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 6), spec("p", range(30, 33), 1, publish_snapshot=True))
    plan = launch(driver)  # p finished with its prefill; its checkpoint copies ride in this round
    assert plan.copies and launch(driver) is None
    driver.run()
    assert scheduler.counters().snapshots_published == 1


def test_no_second_frame_without_device_pending_tokens_or_when_disabled():
    caps = capacities(max_active=4)
    host_fed = tuple(dataclasses.replace(v, device_pending=False) if v.operation == Operation.DECODE else v
                     for v in caps.variants)
    caps = dataclasses.replace(caps, variants=host_fed)
    for policy, chosen in ((SchedulerPolicy(), caps), (SchedulerPolicy(two_frames=False), capacities(max_active=4))):
        driver = Driver(Scheduler.create(chosen, policy), FakeExecutor(chosen))
        decoding(driver, spec("a", range(1, 8), 4))
        assert launch(driver) is not None and launch(driver) is None
        driver.run()
        assert driver.max_inflight == 1


def test_lane_at_its_output_limit_is_left_out_of_the_second_frame():
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 2), spec("b", range(10, 13), 6))
    launch(driver)
    assert [r.request_id for r in launch(driver).rows] == ["b"]
    driver.run()
    assert driver.outcomes["a"].tokens == reference(range(1, 8), 2)


def test_eos_in_the_first_frame_discards_the_second_and_frees_after_its_fence():
    prompt = list(range(1, 8))
    eos = reference(prompt, 3)[1]
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", prompt, 6, eos_ids=frozenset({eos})))
    launch(driver), launch(driver)
    slot = scheduler.view("a").slot
    events = finish_oldest(driver)
    assert events[-1] == FinishEvent("a", FinishReason.EOS, 7, 2, 0)
    assert scheduler.slots.owner(slot) == "a"  # held through the second frame's fence
    assert finish_oldest(driver) == [] and scheduler.slots.owner(slot) is None
    assert driver.outcomes["a"].tokens == reference(prompt, 3, frozenset({eos}))
    assert_all_released(scheduler)


def test_cancel_while_queued_and_between_chunks_frees_at_once():
    scheduler, driver = make(max_active=2, prefill_tokens=16, mixed=False)
    driver.submit(spec("queued", [1, 2], 2, priority=5), spec("long", range(1, 50), 2))
    driver.cancel("queued")
    assert driver.outcomes["queued"].finish.reason == FinishReason.CANCELLED
    assert scheduler.view("queued") is None
    plan = launch(driver)
    finish_oldest(driver)  # first chunk done, nothing in flight
    assert plan.rows[0].request_id == "long" and not plan.rows[0].samples
    driver.cancel("long")
    assert scheduler.slots.num_free == 2 and scheduler.cache.pool.num_available == scheduler.cache.pool.num_pages
    assert scheduler.cancel("long") == [] and scheduler.cancel("unknown") == []
    assert_all_released(scheduler)


def test_cancel_with_both_frames_in_flight_releases_exactly_once_after_the_last_fence():
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 9), spec("b", range(10, 13), 9))
    launch(driver), launch(driver)
    a = scheduler.queues.requests["a"]
    slot, pages = a.slot, list(a.page_ids)
    driver.cancel("a")
    assert driver.outcomes["a"].finish.reason == FinishReason.CANCELLED
    allocator = scheduler.cache.pool.allocator
    for _ in range(2):
        assert scheduler.slots.owner(slot) == "a" and all(allocator.ref_count(p) >= 1 for p in pages)
        events = finish_oldest(driver)
        assert all(e.request_id == "b" for e in events)
    assert scheduler.slots.owner(slot) is None and scheduler.view("a") is None
    assert launch(driver).rows[0].request_id == "b"
    driver.run()
    assert driver.outcomes["a"].num_finishes == 1
    assert driver.outcomes["b"].tokens == reference(range(10, 13), 9)
    assert_all_released(scheduler)


def test_host_stop_ends_with_stop_and_publishes_nothing():
    scheduler, driver = make(max_active=2)
    decoding(driver, spec("s", range(1, 11), 8, stop_strings=("yes",), publish_snapshot=True))
    tokens_before = list(driver.outcomes["s"].tokens)
    driver.stop("s")
    assert driver.outcomes["s"].finish.reason == FinishReason.STOP
    assert driver.outcomes["s"].finish.num_output_tokens == len(tokens_before) == 1
    assert scheduler.schedule() is None and scheduler.counters().snapshots_published == 0
    assert scheduler.cache.snapshots.snapshots() == []
    assert scheduler.cache.pool.cache.num_cached == 2  # earlier immutable pages stay cached
    assert_all_released(scheduler)


def test_token_events_carry_observation_times_only_when_observed():
    times = iter(range(100, 200))
    calls = []

    def clock():
        calls.append(1)
        return next(times)

    caps = capacities(max_active=4)
    scheduler = Scheduler.create(caps, clock=clock)
    driver = Driver(scheduler, FakeExecutor(caps))
    driver.submit(spec("plain", [1, 2, 3], 2))
    driver.run()
    assert calls == []  # no observed request: the clock is never read
    driver.submit(spec("seen", [4, 5], 3, observe=True), spec("unseen", [6, 7], 3))
    driver.run()
    stamps = [e.observed_ns for e in driver.outcomes["seen"].token_events]
    assert stamps == sorted(stamps) and len(stamps) == 3 and stamps[0] >= 100
    assert all(e.observed_ns is None for e in driver.outcomes["unseen"].token_events)
    assert len(calls) == 3  # one read per completion that carried an observed token
    assert all(isinstance(e, TokenEvent) for e in driver.outcomes["seen"].token_events)


def test_a_second_frame_only_runs_programs_with_device_pending_tokens():
    """A cohort whose size selects a host-fed DECODE program waits for feedback instead."""
    caps = capacities(max_active=4)
    host_fed_one = tuple(dataclasses.replace(v, device_pending=False)
                         if v.operation == Operation.DECODE and v.batch_capacity == 1 else v for v in caps.variants)
    caps = dataclasses.replace(caps, variants=host_fed_one)
    driver = Driver(Scheduler.create(caps), FakeExecutor(caps))
    driver.submit(spec("a", [1, 2, 3], 2), spec("b", [4, 5, 6], 3), spec("c", [7, 8], 4), spec("e", [9, 9], 12))
    driver.run()
    seconds = [p for p in driver.plans if any(r.pending_on_device for r in p.rows)]
    assert seconds, "the four-row cohort ran second frames"
    assert all(p.variant.device_pending for p in seconds)
    assert_all_released(driver.scheduler)


@pytest.mark.parametrize("prompt", [[5], [5, 6]], ids=["one-token-prompt", "two-token-prompt"])
def test_second_frames_do_not_replace_speculation(prompt):
    """A plain DECODE head (a one-token prompt) must not chain plain rounds behind it in a core
    that speculates: every later round is SPECULATIVE, as with one frame."""
    plans = {}
    for two_frames in (False, True):
        scheduler, driver = make(policy=SchedulerPolicy(two_frames=two_frames), max_active=4, speculative=(3, 4))
        driver.submit(spec("a", prompt, 24))
        driver.run()
        plans[two_frames] = [p.operation for p in driver.plans]
        assert len(driver.outcomes["a"].tokens) == 24
    assert plans[True] == plans[False]
    assert plans[True].count(Operation.SPECULATIVE) >= 6


def test_mixed_grammar_decode_steps_count_only_plans_that_ran():
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 6), spec("g", range(20, 25), 6, constrained=True))
    plan = scheduler.schedule()
    assert plan.operation == Operation.DECODE and 0 < sum(r.constrained for r in plan.rows) < len(plan.rows)
    scheduler.fail(plan, "launch failed")  # the program never ran: nothing is counted
    assert scheduler.counters().mixed_grammar_decode_plans == 0
    scheduler, driver = make(max_active=4)
    decoding(driver, spec("a", range(1, 8), 6), spec("g", range(20, 25), 6, constrained=True))
    plan = scheduler.schedule()
    assert scheduler.counters().mixed_grammar_decode_plans == 0  # built and submitted, not yet run
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    assert scheduler.counters().mixed_grammar_decode_plans == 1

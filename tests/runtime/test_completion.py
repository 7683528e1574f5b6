"""Completion validation: a bad record fails its execution cleanly and touches nobody else."""

from __future__ import annotations

import dataclasses

import pytest

from helios.runtime.records.capacities import LengthSource, Operation
from helios.runtime.records.events import FinishReason
from helios.runtime.records.faults import InvariantViolation, UnknownPlan

from .fake_model import reference
from .harness import assert_all_released, make, spec

PROMPT = list(range(1, 14))


def corrupt(results, index=0, **changes):
    return results[:index] + [results[index]._replace(**changes)] + results[index + 1:]


CASES = {
    "missing record": lambda r: r[:-1],
    "generation": lambda r: corrupt(r, generation=r[0].generation + 1),
    "slot": lambda r: corrupt(r, slot=r[0].slot + 1),
    "sampled id": lambda r: corrupt(r, token_ids=(97,)),
    "negative id": lambda r: corrupt(r, token_ids=(-1,)),
    "two tokens": lambda r: corrupt(r, token_ids=(1, 2)),
    "endpoint": lambda r: corrupt(r, consumed_endpoint=r[0].consumed_endpoint + 1),
    "cursor": lambda r: corrupt(r, draft_cursor=0),
}


@pytest.mark.parametrize("case", CASES)
def test_invalid_record_fails_only_its_plan(case):
    scheduler, driver = make(max_active=4)
    driver.submit(spec("warm", PROMPT, 2))
    driver.run()
    cached = scheduler.cache.pool.cache.num_cached
    driver.submit(spec("a", PROMPT + [40], 3), spec("b", [50, 51, 52], 3))
    plan = scheduler.schedule()
    results = CASES[case](driver.executor.run(plan))
    events = scheduler.complete(plan, results)
    driver.record(events)
    scheduler.check_invariants()
    assert sorted(e.request_id for e in events) == ["a", "b"]
    assert all(e.reason == FinishReason.ERROR and e.message for e in events)
    assert scheduler.cache.pool.cache.num_cached == cached  # nothing from the failed plan was published
    driver.submit(spec("c", PROMPT + [41], 3))
    driver.run()
    assert driver.outcomes["c"].tokens == reference(PROMPT + [41], 3)
    assert driver.outcomes["c"].finish.num_reused_tokens == 12
    assert_all_released(scheduler)


def test_non_sampling_row_must_not_emit():
    scheduler, driver = make(max_active=2, prefill_tokens=16, mixed=False)
    driver.submit(spec("a", range(1, 40), 2))
    plan = scheduler.schedule()
    assert not plan.rows[0].samples
    events = scheduler.complete(plan, corrupt(driver.executor.run(plan), token_ids=(3,)))
    assert [e.reason for e in events] == [FinishReason.ERROR]


def test_completion_out_of_submission_order_fails_that_plan():
    scheduler, driver = make(max_active=4)
    driver.submit(spec("a", range(1, 8), 8))
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    first, second = scheduler.schedule(), scheduler.schedule()
    first_results, second_results = driver.executor.run(first), driver.executor.run(second)
    events = scheduler.complete(second, second_results)
    assert [e.reason for e in events] == [FinishReason.ERROR] and "order" in events[0].message
    assert scheduler.complete(first, first_results) == []  # its only lane already ended
    scheduler.check_invariants()
    assert_all_released(scheduler)
    with pytest.raises(UnknownPlan):
        scheduler.complete(first, first_results)


def test_speculative_lane_ceilings_and_validation():
    scheduler, driver = make(max_active=4, speculative=(3, 4), draft_lag=2)
    driver.submit(spec("a", range(1, 8), 20), spec("short", range(10, 14), 3),
                  spec("stops", range(20, 24), 20, stop_strings=("z",)))
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    plan = scheduler.schedule()
    assert plan.operation == Operation.SPECULATIVE and plan.variant.lane_limit == 4
    assert [(r.request_id, r.query_len, r.token_ceiling) for r in plan.rows] == [
        ("a", 4, 4), ("short", 2, 2), ("stops", 1, 1)]  # min(D + 1, W), the output budget, width one
    a = scheduler.queues.requests["a"]
    assert len(a.page_ids) == scheduler.cache.layout.pages_for(7 + 4)  # pages cover the full ceiling
    results = driver.executor.run(plan)
    assert all(r.draft_cursor == max(r.consumed_endpoint - 2, 0) for r in results)
    bad = corrupt(results, offered_tokens=5)
    events = scheduler.complete(plan, bad)
    assert {e.reason for e in events} == {FinishReason.ERROR} and "ceiling" in events[0].message


@pytest.mark.parametrize("change", [
    lambda r: dict(accepted_drafts=r.accepted_drafts + 1),
    lambda r: dict(draft_cursor=-1),
    lambda r: dict(consumed_endpoint=r.consumed_endpoint - 1),
])
def test_speculative_records_must_agree_with_themselves(change):
    scheduler, driver = make(max_active=4, speculative=(3, 4), draft_lag=2)
    driver.submit(spec("a", range(1, 8), 20))
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    plan = scheduler.schedule()
    results = driver.executor.run(plan)
    events = scheduler.complete(plan, corrupt(results, **change(results[0])))
    assert [e.reason for e in events] == [FinishReason.ERROR]


def test_check_invariants_detects_corruption():
    scheduler, driver = make(max_active=2)
    driver.submit(spec("a", range(1, 8), 4))
    driver.step()
    scheduler.check_invariants()
    scheduler.queues.requests["a"].page_ids.append(scheduler.cache.pool.allocator.free_pages()[0])
    with pytest.raises(InvariantViolation):
        scheduler.check_invariants()


def test_prefix_limit_ceilings_may_exceed_p_but_offers_may_not():
    scheduler, driver = make(max_active=4, speculative=(3, 4), length_source=LengthSource.PREFIX_LIMIT)
    caps = scheduler.caps
    narrow = tuple(dataclasses.replace(v, packed_token_capacity=5) if v.operation == Operation.SPECULATIVE else v
                   for v in caps.variants)
    scheduler.caps = scheduler.builder.caps = dataclasses.replace(caps, variants=narrow)
    driver.submit(spec("a", range(1, 8), 20), spec("b", range(10, 14), 20))
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    plan = scheduler.schedule()
    assert [r.token_ceiling for r in plan.rows] == [4, 4] and plan.variant.packed_token_capacity == 5
    results = driver.executor.run(plan)  # the fake offers each lane's full ceiling: 8 > P
    assert sum(r.offered_tokens for r in results) == 8
    events = scheduler.complete(plan, results)
    assert {e.reason for e in events} == {FinishReason.ERROR}
    assert "exceed P" in events[0].message

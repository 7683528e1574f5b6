"""Output equivalence through the fake model: cache hits, preemption, concurrency, speculation."""

from __future__ import annotations

import random

import pytest

from helios.runtime.records.capacities import LengthSource
from helios.runtime.records.events import FinishReason
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy

from .fake_model import reference
from .harness import assert_all_released, make, spec


def prompts(count: int, seed: int, shared: int = 0, low: int = 3, high: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 97) for _ in range(shared)]
    return [prefix + [rng.randrange(1, 97) for _ in range(rng.randrange(low, high))] for _ in range(count)]


def run_all(driver, items, max_output=12, name="r", **options):
    driver.submit(*(spec(f"{name}{i}", p, max_output, **options) for i, p in enumerate(items)))
    return driver.run()


def test_greedy_output_with_prefix_hit_equals_miss():
    items = prompts(6, seed=1, shared=23)
    scheduler, driver = make(max_active=4)
    run_all(driver, items[:1], name="warm")  # warms the cache with the shared prefix
    outcomes = run_all(driver, items)
    assert scheduler.counters().prefix_reused_tokens > 0
    assert all(driver.outcomes[f"r{i}"].finish.num_reused_tokens >= 20 for i in range(1, 6))
    cold, cold_driver = make(max_active=4, policy=SchedulerPolicy(prefix_caching=False))
    cold_outcomes = run_all(cold_driver, items)
    assert cold.counters().prefix_reused_tokens == 0
    for i, prompt in enumerate(items):
        assert outcomes[f"r{i}"].tokens == cold_outcomes[f"r{i}"].tokens == reference(prompt, 12)
    assert_all_released(scheduler)


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD])
def test_output_after_preemption_equals_without(mode):
    items = prompts(8, seed=2, low=10, high=30)
    scheduler, driver = make(max_active=8, num_pages=24, policy=SchedulerPolicy(preemption=mode))
    outcomes = run_all(driver, items, max_output=30)
    assert scheduler.counters().preemptions > 0
    if mode == PreemptionMode.OFFLOAD:
        assert driver.executor.num_copies > 0
    for i, prompt in enumerate(items):
        assert outcomes[f"r{i}"].tokens == reference(prompt, 30), f"r{i}"
        assert outcomes[f"r{i}"].finish.reason == FinishReason.LENGTH
    assert_all_released(scheduler)


def test_output_at_concurrency_one_equals_sixty_four():
    items = prompts(64, seed=3, shared=6)
    one, one_driver = make(max_active=1, num_pages=512, prefill_tokens=64)
    many, many_driver = make(max_active=64, num_pages=512, prefill_tokens=2048, context=2048)
    out_one = run_all(one_driver, items, max_output=10, eos_ids=frozenset({5}))
    out_many = run_all(many_driver, items, max_output=10, eos_ids=frozenset({5}))
    assert max(len(plan.rows) for plan in many_driver.plans) == 64
    for i, prompt in enumerate(items):
        expected = reference(prompt, 10, frozenset({5}))
        assert out_one[f"r{i}"].tokens == out_many[f"r{i}"].tokens == expected
    assert_all_released(one)
    assert_all_released(many)


@pytest.mark.parametrize("source", [LengthSource.QUERY_LENGTH, LengthSource.PREFIX_LIMIT])
def test_speculative_output_equals_decode(source):
    items = prompts(10, seed=4)
    scheduler, driver = make(max_active=8, speculative=(3, 4), length_source=source, draft_lag=1)
    outcomes = run_all(driver, items, max_output=20, eos_ids=frozenset({7}))
    speculative = [plan for plan in driver.plans if plan.operation.name == "SPECULATIVE"]
    assert speculative and any(len(e.token_ids) > 1 for o in outcomes.values() for e in o.token_events)
    for i, prompt in enumerate(items):
        assert outcomes[f"r{i}"].tokens == reference(prompt, 20, frozenset({7}))
    assert_all_released(scheduler)


def test_chunked_prefill_without_mixed_programs():
    items = prompts(5, seed=5, low=30, high=90)
    scheduler, driver = make(max_active=4, prefill_tokens=16, mixed=False, context=128)
    outcomes = run_all(driver, items, max_output=9)
    assert {plan.operation.name for plan in driver.plans} == {"PREFILL", "DECODE"}
    for i, prompt in enumerate(items):
        assert outcomes[f"r{i}"].tokens == reference(prompt, 9)
    assert_all_released(scheduler)


def test_published_snapshot_restores_exact_endpoint():
    first = prompts(1, seed=6, low=13, high=14)[0]
    scheduler, driver = make(max_active=2)
    run_all(driver, [first], max_output=6, publish_snapshot=True)
    driver.run()  # the checkpoint copies travel in a copy-only plan
    assert scheduler.counters().snapshots_published == 1
    follow = first + driver.outcomes["r0"].tokens + [11, 12, 13]
    driver.submit(spec("turn2", follow, 8))
    driver.run()
    endpoint = len(first) + 6 - 1
    assert driver.outcomes["turn2"].finish.num_reused_tokens == endpoint
    assert driver.outcomes["turn2"].tokens == reference(follow, 8)
    assert_all_released(scheduler)


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD])
def test_state_layout_preemption(mode):
    items = prompts(6, seed=7, low=8, high=20)
    scheduler, driver = make(max_active=6, num_pages=16, stateful=True, policy=SchedulerPolicy(preemption=mode))
    outcomes = run_all(driver, items, max_output=16, publish_snapshot=True)
    driver.run()
    assert scheduler.counters().preemptions > 0
    for i, prompt in enumerate(items):
        assert outcomes[f"r{i}"].tokens == reference(prompt, 16, stateful=True), f"r{i}"
    assert_all_released(scheduler)


def test_state_layout_reuses_only_snapshots():
    first = prompts(1, seed=8, low=12, high=13)[0]  # page aligned: the snapshot holds state only
    scheduler, driver = make(max_active=2, stateful=True)
    run_all(driver, [first], max_output=5, publish_snapshot=True)
    driver.run()
    same_pages = first[:8] + [1, 2, 3, 4, 5]
    follow = first + driver.outcomes["r0"].tokens + [3]
    driver.submit(spec("pages-only", same_pages, 4), spec("turn2", follow, 5))
    driver.run()
    assert driver.outcomes["pages-only"].finish.num_reused_tokens == 0
    assert driver.outcomes["pages-only"].tokens == reference(same_pages, 4, stateful=True)
    assert driver.outcomes["turn2"].finish.num_reused_tokens == len(first) + 4
    assert driver.outcomes["turn2"].tokens == reference(follow, 5, stateful=True)
    assert_all_released(scheduler)


@pytest.mark.parametrize("stable", [0, 13, 12], ids=["no-stable-prefix", "stable-prefix", "page-aligned"])
def test_state_layout_publishes_the_stable_prefix_for_the_next_turn(stable):
    """A chat turn whose template re-renders its tail (the generation prompt, the reply) differently
    next turn: only its stable prefix is reused, through the snapshot published where it ends (a
    partial page and the state rows, or the state rows alone at a page boundary)."""
    first = prompts(1, seed=9, low=20, high=21)[0]
    scheduler, driver = make(max_active=2, stateful=True)
    run_all(driver, [first], max_output=4, stable_prefix_len=stable)
    ends = {row.start_pos + row.query_len for plan in driver.plans for row in plan.rows}
    assert (stable in ends) == bool(stable)
    turn2 = first[:stable or 13] + [7, 7, 8, 9, 9, 9]
    driver.submit(spec("turn2", turn2, 5))
    driver.run()
    counters = scheduler.counters()
    assert driver.outcomes["turn2"].finish.num_reused_tokens == stable
    assert counters.snapshots_restored == (1 if stable else 0)
    assert counters.snapshots_published == (2 if stable else 1) + 1  # stable end, prompt ends of both turns
    assert driver.outcomes["turn2"].tokens == reference(turn2, 5, stateful=True)
    assert_all_released(scheduler)

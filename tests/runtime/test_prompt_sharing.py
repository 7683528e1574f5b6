"""Requests with the same prompt (the choices of one request) share its pages at admission: exact
rows, copies, page tables, reference counts and prefill token counts, against separate prefills."""

from __future__ import annotations

import dataclasses

from helios.runtime.records.capacities import Operation
from helios.runtime.records.plan import CopyOp, Location, StorageKind
from helios.runtime.scheduling.policy import SchedulerPolicy

from .fake_model import reference
from .harness import assert_all_released, make, spec

PROMPT = list(range(1, 15))  # 14 tokens: pages of 4 tokens hold 4 + 4 + 4 + 2


def prompt_tokens(plans, prompt_len: int) -> int:
    """Prompt positions computed by the plans (rows below the prompt's end)."""
    return sum(max(0, min(row.start_pos + row.query_len, prompt_len) - row.start_pos)
               for plan in plans for row in plan.rows)


def choices(n: int, max_output: int = 5):
    return [spec(f"c{j}", PROMPT, max_output) for j in range(n)]


def run_choices(n: int, policy: SchedulerPolicy = SchedulerPolicy()):
    scheduler, driver = make(policy, max_active=8, num_pages=64)
    driver.submit(*choices(n))
    first = scheduler.schedule()
    allocator = scheduler.cache.pool.allocator
    pages_after_first = allocator.num_pages - allocator.num_free
    driver.plans.append(first)
    driver.inflight.append((first, driver.executor.run(first)))
    driver.run()
    return scheduler, driver, first, pages_after_first


def test_four_choices_prefill_the_prompt_once():
    scheduler, driver, first, _ = run_choices(4)
    assert [(r.request_id, r.start_pos, r.query_len) for r in first.rows] == [("c0", 0, 14)]
    second = driver.plans[1]
    assert second.operation == Operation.DECODE  # one pending token each: a plain decode program
    assert [(r.request_id, r.start_pos, r.query_len, r.admits) for r in second.rows] == [
        ("c0", 14, 1, False), ("c1", 13, 1, True), ("c2", 13, 1, True), ("c3", 13, 1, True)]
    # c0 holds pages 0-3; each later choice shares pages 0-2 and gets a private page for position 13
    assert [r.new_page_ids for r in second.rows[1:]] == [(0, 1, 2, 4), (0, 1, 2, 5), (0, 1, 2, 6)]
    page = lambda index: Location(StorageKind.PAGE, index)  # noqa: E731
    assert second.copies == tuple(CopyOp(page(3), page(dst), 1) for dst in (4, 5, 6))
    assert prompt_tokens(driver.plans, len(PROMPT)) == 14 + 3
    expected = reference(PROMPT, 5)
    assert all(driver.outcomes[f"c{j}"].tokens == expected for j in range(4))
    assert [driver.outcomes[f"c{j}"].finish.num_reused_tokens for j in range(4)] == [0, 13, 13, 13]
    assert scheduler.cache.groups.num_shared_admissions == 3
    assert scheduler.counters().prefix_reused_tokens == 39
    assert_all_released(scheduler)


def test_shared_pages_are_counted_once_per_holder():
    scheduler, driver = make(max_active=8, num_pages=64)
    driver.submit(*choices(4))
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    allocator = scheduler.cache.pool.allocator
    assert allocator.num_pages - allocator.num_free == 4  # n = 1 would hold the same 4 pages
    plan = scheduler.schedule()
    assert [allocator.ref_count(p) for p in range(8)] == [4, 4, 4, 1, 1, 1, 1, 0]
    assert allocator.num_pages - allocator.num_free == 7  # 4 + one private page per later choice
    scheduler.check_invariants()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    driver.run()
    assert_all_released(scheduler)


def test_page_accounting_against_one_choice_and_separate_prefills():
    _, one, first_one, pages_one = run_choices(1)
    _, shared, _, _ = run_choices(4)
    _, separate, first_separate, pages_separate = run_choices(4, SchedulerPolicy(prefix_caching=False))
    assert (prompt_tokens(one.plans, 14), pages_one) == (14, 4)
    assert prompt_tokens(shared.plans, 14) == 17
    assert (prompt_tokens(separate.plans, 14), pages_separate) == (56, 16)
    assert [r.query_len for r in first_separate.rows] == [14] * 4
    outputs = lambda driver: [driver.outcomes[f"c{j}"].tokens for j in range(4)]  # noqa: E731
    assert outputs(shared) == outputs(separate) == [one.outcomes["c0"].tokens] * 4


def test_a_page_aligned_prompt_copies_nothing_and_a_late_choice_shares_directly():
    prompt = list(range(1, 14))  # 13 tokens: the last one opens page 3
    scheduler, driver = make(max_active=8, num_pages=64)
    driver.submit(spec("a", prompt, 6))
    for _ in range(3):
        driver.step()  # a prefills, completes, decodes once
    driver.submit(spec("b", prompt, 3))
    driver.run()
    b_first = next(r for plan in driver.plans for r in plan.rows if r.request_id == "b")
    assert (b_first.start_pos, b_first.query_len, b_first.new_page_ids[:3]) == (12, 1, (0, 1, 2))
    assert not any(plan.copies for plan in driver.plans)
    assert driver.outcomes["b"].tokens == reference(prompt, 3)
    assert_all_released(scheduler)


def test_a_waiting_choice_prefills_itself_when_its_source_is_cancelled():
    scheduler, driver = make(max_active=8, num_pages=64, prefill_tokens=16)
    long_prompt = list(range(1, 41))  # three prefill chunks
    driver.submit(spec("a", long_prompt, 4), spec("b", long_prompt, 4), spec("z", [7, 8, 9], 2))
    plan = scheduler.schedule()
    assert [r.request_id for r in plan.rows] == ["a"]  # b waits for a's prompt, z waits behind b
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    driver.cancel("a")
    plan = scheduler.schedule()
    assert [(r.request_id, r.start_pos) for r in plan.rows] == [("b", 16)]  # a's first chunk was published
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    driver.run()
    assert driver.outcomes["b"].tokens == reference(long_prompt, 4)
    assert driver.outcomes["z"].tokens == reference([7, 8, 9], 2)
    assert scheduler.cache.groups.num_shared_admissions == 0
    assert_all_released(scheduler)


def test_different_salts_scoring_and_stateful_layouts_do_not_share():
    scheduler, driver = make(max_active=8, num_pages=64)
    driver.submit(spec("a", PROMPT, 2), spec("b", PROMPT, 2, cache_salt=b"other"),
                  spec("s", PROMPT, 2, score_prompt=True))
    plan = scheduler.schedule()
    assert [(r.request_id, r.query_len) for r in plan.rows] == [("a", 14), ("b", 14)]
    driver.plans.append(plan)
    driver.inflight.append((plan, driver.executor.run(plan)))
    driver.run()
    assert scheduler.cache.groups.num_shared_admissions == 0
    stateful, stateful_driver = make(max_active=8, num_pages=64, stateful=True)
    stateful_driver.submit(spec("a", PROMPT, 2), spec("b", PROMPT, 2))
    assert [r.query_len for r in stateful.schedule().rows] == [14, 14]


def test_sharing_survives_preemption_and_pressure():
    """A small pool: choices share, get preempted and readmitted; every output stays exact."""
    scheduler, driver = make(max_active=4, num_pages=12, prefill_tokens=16)
    driver.submit(*[spec(f"c{j}", PROMPT, 12) for j in range(4)], spec("x", list(range(50, 66)), 10))
    driver.run()
    for j in range(4):
        assert driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 12)
    assert driver.outcomes["x"].tokens == reference(list(range(50, 66)), 10)
    assert scheduler.counters().preemptions > 0 and scheduler.cache.groups.num_shared_admissions > 0
    assert_all_released(scheduler)


def test_a_decode_program_that_cannot_admit_leaves_admissions_to_prompt_programs():
    """A DECODE program reading per-slot state only prompt programs write (`admits_slots` False):
    the choices' one-token admission rows run in a MIXED program beside the decoding source."""
    scheduler, driver = make(max_active=8, num_pages=64)
    caps = scheduler.caps
    variants = tuple(dataclasses.replace(v, admits_slots=False) if v.operation == Operation.DECODE else v
                     for v in caps.variants)
    scheduler.caps = scheduler.builder.caps = dataclasses.replace(caps, variants=variants)
    driver.submit(*choices(3))
    driver.step()
    driver.step()
    second = driver.scheduler.schedule()
    assert second.operation == Operation.MIXED and [r.admits for r in second.rows] == [False, True, True]
    driver.plans.append(second)
    driver.inflight.append((second, driver.executor.run(second)))
    driver.run()
    assert all(driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 5) for j in range(3))
    assert all(plan.operation == Operation.DECODE for plan in driver.plans[2:])


def test_sliding_window_choices_share_and_release_their_pages():
    scheduler, driver = make(max_active=8, num_pages=64, window=8)
    driver.submit(*[spec(f"c{j}", PROMPT, 12) for j in range(3)])
    driver.run()
    assert scheduler.cache.groups.num_shared_admissions == 2
    assert all(driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 12, window=8) for j in range(3))
    assert_all_released(scheduler)

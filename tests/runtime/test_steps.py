"""Step composition with exact state: rows, chunking, programs, page tables, prefix reuse."""

from __future__ import annotations

from helios.runtime.records.capacities import Operation
from helios.runtime.records.request import RequestStatus

from .fake_model import reference
from .harness import assert_all_released, make, spec


def run_plan(scheduler, driver, plan):
    """Execute and complete one plan; returns the events."""
    events = scheduler.complete(plan, driver.executor.run(plan))
    driver.record(events)
    scheduler.check_invariants()
    return events


def test_first_step_prefills_with_exact_rows_and_pages():
    scheduler, driver = make(max_active=4, num_pages=16)
    driver.submit(spec("a", range(1, 11), 3), spec("b", range(30, 35), 3))
    plan = scheduler.schedule()
    assert (plan.sequence, plan.frame, plan.operation, plan.variant.name) == (0, 0, Operation.PREFILL, "prefill16")
    a, b = plan.rows
    assert a.request_id == "a" and a.slot == 0 and a.generation == 1 and a.token_ids == tuple(range(1, 11))
    assert (a.start_pos, a.query_len, a.page_table_start, a.new_page_ids) == (0, 10, 0, (0, 1, 2))
    assert a.samples and a.sample_index == 0 and a.token_ceiling == 1 and a.admits and not a.pending_on_device
    assert (b.slot, b.new_page_ids, b.query_len) == (1, (3, 4), 5)
    assert plan.num_tokens == 15 and plan.copies == ()
    allocator = scheduler.cache.pool.allocator
    assert [allocator.ref_count(p) for p in range(6)] == [1, 1, 1, 1, 1, 0]
    assert scheduler.schedule() is None  # a prefill needs feedback before the next round
    run_plan(scheduler, driver, plan)
    decode = scheduler.schedule()
    assert decode.operation == Operation.DECODE and decode.variant.name == "decode4"
    row = decode.rows[0]
    assert row.token_ids == (driver.outcomes["a"].tokens[0],) and row.start_pos == 10
    assert (row.page_table_start, row.new_page_ids, row.admits, row.sample_index) == (3, (), False, 1)
    # pages of complete prompt pages are published once committed
    assert scheduler.cache.pool.cache.num_cached == 3  # a's two pages and b's one


def test_long_prompt_is_chunked_by_the_prefill_extent():
    scheduler, driver = make(max_active=2, prefill_tokens=16, mixed=False)
    prompt = list(range(1, 41))
    driver.submit(spec("a", prompt, 2))
    rows = []
    while (plan := scheduler.schedule()) is not None:
        rows.append(plan.rows[0])
        run_plan(scheduler, driver, plan)
    assert [(r.start_pos, r.query_len, r.samples, r.page_table_start, len(r.new_page_ids)) for r in rows] == [
        (0, 16, False, 0, 4), (16, 16, False, 4, 4), (32, 8, True, 8, 2), (40, 1, True, 10, 1)]
    assert driver.outcomes["a"].tokens == reference(prompt, 2)


def test_mixed_step_reserves_a_token_for_every_decoding_lane():
    scheduler, driver = make(max_active=4, prefill_tokens=16)
    driver.submit(spec("a", range(1, 5), 5))
    run_plan(scheduler, driver, scheduler.schedule())
    driver.submit(spec("b", range(1, 40), 2))
    plan = scheduler.schedule()
    assert plan.operation == Operation.MIXED and plan.num_tokens == 16
    assert [(r.request_id, r.query_len, r.samples) for r in plan.rows] == [("a", 1, True), ("b", 15, False)]


def test_without_mixed_programs_prompt_and_decode_steps_alternate():
    scheduler, driver = make(max_active=4, prefill_tokens=16, mixed=False)
    driver.submit(spec("a", range(1, 5), 6))
    run_plan(scheduler, driver, scheduler.schedule())
    driver.submit(spec("b", range(1, 60), 2))
    ops = []
    for _ in range(5):
        plan = scheduler.schedule()
        ops.append((plan.operation, tuple(r.request_id for r in plan.rows)))
        run_plan(scheduler, driver, plan)
    assert ops == [(Operation.DECODE, ("a",)), (Operation.PREFILL, ("b",)), (Operation.DECODE, ("a",)),
                   (Operation.PREFILL, ("b",)), (Operation.DECODE, ("a",))]


def test_prefix_hit_shares_pages_and_counts_references():
    scheduler, driver = make(max_active=4, num_pages=32)
    prompt = list(range(1, 14))
    driver.submit(spec("a", prompt, 1))
    driver.run()
    pool = scheduler.cache.pool
    assert pool.cache.parked_pages() == [2, 1, 0]  # tails first, so chains are evicted from the end
    driver.submit(spec("b", prompt[:12] + [50, 51], 4), spec("c", prompt[:9], 2))
    plan = scheduler.schedule()
    b, c = plan.rows
    assert (b.start_pos, b.query_len, b.page_table_start, b.new_page_ids[:3]) == (12, 2, 0, (0, 1, 2))
    assert (c.start_pos, c.query_len, c.new_page_ids[:2]) == (8, 1, (0, 1))
    assert [pool.allocator.ref_count(p) for p in (0, 1, 2)] == [2, 2, 1] and pool.cache.num_parked == 0
    run_plan(scheduler, driver, plan)
    driver.run()
    assert driver.outcomes["b"].finish.num_reused_tokens == 12 and driver.outcomes["c"].finish.num_reused_tokens == 8
    assert driver.outcomes["b"].tokens == reference(prompt[:12] + [50, 51], 4)
    assert scheduler.counters().prefix_reused_tokens == 20
    assert_all_released(scheduler)


def test_cache_salt_separates_namespaces_and_scoring_skips_reuse():
    scheduler, driver = make()
    prompt = list(range(1, 14))
    driver.submit(spec("a", prompt, 1))
    driver.run()
    driver.submit(spec("salted", prompt, 1, cache_salt=b"tenant"), spec("scored", prompt, 1, score_prompt=True))
    outcomes = driver.run()
    assert outcomes["salted"].finish.num_reused_tokens == 0
    assert outcomes["scored"].finish.num_reused_tokens == 0
    scored_plans = [p for p in driver.plans if p.operation == Operation.SCORED_PREFILL]
    assert [r.request_id for p in scored_plans for r in p.rows] == ["scored"]


def test_unreferenced_pages_are_evicted_in_lru_order():
    scheduler, driver = make(max_active=2, num_pages=6)
    driver.submit(spec("a", range(1, 9), 1))
    driver.run()
    driver.submit(spec("b", range(20, 28), 1))
    driver.run()
    pool = scheduler.cache.pool
    parked = pool.cache.parked_pages()
    a_pages = [r.new_page_ids for p in driver.plans for r in p.rows if r.request_id == "a" and r.admits][0]
    assert len(parked) == 4 and parked[0] == a_pages[1]  # a's tail page is the least recently used
    free = pool.allocator.free_pages()
    assert len(free) == 2
    driver.submit(spec("c", range(40, 51), 1))  # needs 3 pages: 2 free + the oldest parked
    plan = scheduler.schedule()
    assert plan.rows[0].new_page_ids == (*free, parked[0])
    assert pool.num_evicted == 1 and not pool.cache.is_cached(parked[0])
    assert pool.cache.parked_pages() == parked[1:]


def test_slot_generations_grow_on_every_assignment():
    scheduler, driver = make(max_active=1)
    driver.submit(spec("a", [1, 2], 1), spec("b", [3, 4], 1))
    driver.run()
    admitted = [(r.request_id, r.slot, r.generation) for p in driver.plans for r in p.rows if r.admits]
    assert admitted == [("a", 0, 1), ("b", 0, 2)]
    assert scheduler.view("a") is None and driver.outcomes["b"].finish.reason.name == "LENGTH"


def test_views_are_read_only_copies():
    scheduler, driver = make()
    driver.submit(spec("a", [1, 2, 3], 3))
    view = scheduler.view("a")
    assert view.status == RequestStatus.WAITING and view.output_ids == () and view.slot == -1
    driver.step()
    assert scheduler.view("a").slot == 0 and view.slot == -1

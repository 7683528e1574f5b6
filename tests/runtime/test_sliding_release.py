"""Sliding-window history release: pages outside every region's window go back to the pool.

The fake model of these tests reads only the last `window` tokens through the page table, so a page
released while still inside the window (and then reused) changes its output.
"""

from __future__ import annotations

import pytest

from helios.runtime.records.capacities import HistoryKind, HistoryRegion, PageTableView, StorageLayout
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.records.request import RELEASED_PAGE
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import FakeExecutor, reference
from .harness import Driver, assert_all_released, capacities, make, spec

WINDOW, PAGE_TOKENS = 6, 4
SLIDING = HistoryRegion("kv", HistoryKind.SLIDING_WINDOW, window_tokens=WINDOW)
NO_PREFIX = SchedulerPolicy(prefix_caching=False)


def held(req) -> list[int]:
    return [page for page in req.page_ids if page != RELEASED_PAGE]


def test_layout_releases_only_when_every_paged_region_slides():
    assert StorageLayout(4, (SLIDING,)).release_window == WINDOW
    wider = HistoryRegion("draft", HistoryKind.SLIDING_WINDOW, window_tokens=10)
    assert StorageLayout(4, (SLIDING, wider)).release_window == 10  # outside every window
    full = HistoryRegion("full", HistoryKind.PAGED_KV)
    assert StorageLayout(4, (SLIDING, full)).release_window == 0  # a full layer reads every page
    assert StorageLayout(4).releasable_pages(1000) == 0
    layout = StorageLayout(4, (SLIDING,))
    # a query at n reads (n - 6, n]: positions below n - 5 are never read again
    assert [layout.releasable_pages(n) for n in (0, 5, 8, 9, 12, 13, 21)] == [0, 0, 0, 1, 1, 2, 4]
    shifted = StorageLayout(4, (SLIDING,), (PageTableView("kv"), PageTableView("draft", 1)))
    assert shifted.releasable_pages(13) == 1  # a view one page ahead keeps one more


def test_long_generation_holds_two_pages_after_every_round():
    """Prompt 5, window 6, pages of 4: after each round the request holds exactly the 2 pages its
    next query can read; every other page is free again (no prefix cache: nothing parks)."""
    scheduler, driver = make(NO_PREFIX, window=WINDOW, page_tokens=PAGE_TOKENS, num_pages=12, context=48)
    driver.submit(spec("a", [3, 1, 4, 1, 5], 40))
    req, pool = scheduler.queues.requests["a"], scheduler.cache.pool
    counts = []
    while (plan := scheduler.schedule()) is not None:
        driver.record(scheduler.complete(plan, driver.executor.run(plan)))
        scheduler.check_invariants()
        if req.slot < 0:
            break
        n = req.num_computed_tokens
        assert len(req.page_ids) == -(-n // PAGE_TOKENS)
        assert req.num_released_pages == max(0, n - WINDOW + 1) // PAGE_TOKENS
        assert req.page_ids[:req.num_released_pages] == [RELEASED_PAGE] * req.num_released_pages
        counts.append(len(held(req)))
        assert pool.allocator.num_free == 12 - len(held(req))
    assert counts == [2] * 39  # 40 rounds emit 40 tokens; the last one ends the request
    assert driver.outcomes["a"].tokens == reference([3, 1, 4, 1, 5], 40, window=WINDOW)
    assert pool.allocator.num_free == 12
    assert_all_released(scheduler)


def test_a_full_attention_layout_keeps_every_page():
    caps = capacities(page_tokens=PAGE_TOKENS, num_pages=16, context=64)
    scheduler = Scheduler.create(caps, NO_PREFIX, clock=iter(range(10**9)).__next__)
    driver = Driver(scheduler, FakeExecutor(caps))
    driver.submit(spec("a", [3, 1, 4, 1, 5], 40))
    req = scheduler.queues.requests["a"]
    while req.num_output_tokens < 39:
        driver.step()
    assert req.num_released_pages == 0 and len(held(req)) == -(-req.num_computed_tokens // PAGE_TOKENS) == 11


def run_four(window_layout: bool, policy=NO_PREFIX) -> tuple[Scheduler, Driver, int]:
    """Four 45-token requests on a pool that holds one whole request (12 pages); the peak of pages
    in use over the run."""
    caps = capacities(max_active=4, page_tokens=PAGE_TOKENS, num_pages=12, context=48,
                      window=WINDOW if window_layout else 0)
    scheduler = Scheduler.create(caps, policy, clock=iter(range(10**9)).__next__)
    driver = Driver(scheduler, FakeExecutor(caps, window=WINDOW))
    prompts = {f"r{i}": [i + 1, 7, i + 3, 9, 2] for i in range(4)}
    driver.submit(*(spec(name, prompt, 40) for name, prompt in prompts.items()))
    peak = 0
    while driver.step():
        peak = max(peak, 12 - scheduler.cache.pool.num_available)
    for name, prompt in prompts.items():
        assert driver.outcomes[name].tokens == reference(prompt, 40, window=WINDOW)
    assert_all_released(scheduler)
    return scheduler, driver, peak


def test_concurrent_long_generations_fit_a_pool_of_one_context():
    scheduler, _, peak = run_four(window_layout=True)
    assert scheduler.counters().preemptions == 0
    assert peak <= 4 * 3  # each request: its 2 window pages plus the page a round grows
    kept, _, kept_peak = run_four(window_layout=False)
    assert kept.counters().preemptions > 0 and kept_peak == 12  # the same run without release


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD])
def test_a_preempted_request_with_released_pages_recomputes(mode):
    """A request that released pages is never checkpointed (a snapshot would lack them): preempted
    under either mode, it recomputes its history and still generates the same tokens."""
    caps = capacities(max_active=4, page_tokens=PAGE_TOKENS, num_pages=6, context=24, prefill_tokens=16,
                      window=WINDOW)
    scheduler = Scheduler.create(caps, SchedulerPolicy(preemption=mode, prefix_caching=False),
                                 clock=iter(range(10**9)).__next__)
    driver = Driver(scheduler, FakeExecutor(caps, window=WINDOW))
    driver.submit(spec("low", [3, 1, 4, 1, 5], 18, priority=5))
    low = scheduler.queues.requests["low"]
    while low.num_computed_tokens < 14:
        driver.step()
    assert low.num_released_pages == 2 and len(held(low)) == 2
    high = {"h0": [40, 41, 42, 43, 44], "h1": [41, 42, 43, 44, 45]}
    driver.submit(*(spec(name, prompt, 8) for name, prompt in high.items()))  # they outgrow the pool
    driver.run()
    assert low.num_preemptions == 1 and scheduler.cache.snapshots.num_published == 0
    readmitted = [row for plan in driver.plans for row in plan.rows if row.request_id == "low" and row.admits]
    assert [row.start_pos for row in readmitted] == [0, 0]  # recomputed from the start, never restored
    assert driver.outcomes["low"].tokens == reference([3, 1, 4, 1, 5], 18, window=WINDOW)
    for name, prompt in high.items():
        assert driver.outcomes[name].tokens == reference(prompt, 8, window=WINDOW)
    assert_all_released(scheduler)


def test_released_published_pages_park_and_serve_exact_prefix_hits():
    scheduler, driver = make(window=WINDOW, page_tokens=PAGE_TOKENS, num_pages=16, context=64)
    prompt = list(range(30, 43))  # 13 tokens: 3 complete pages
    driver.submit(spec("a", prompt, 20, publish_snapshot=True))
    req = scheduler.queues.requests["a"]
    first_pages = list(req.page_ids) if req.page_ids else None
    while req.num_released_pages < 3:
        driver.step()
        first_pages = first_pages or list(req.page_ids)
    pool = scheduler.cache.pool
    assert all(pool.cache.is_parked(page) for page in first_pages[:3])  # released while running: parked
    driver.run()
    assert scheduler.cache.snapshots.num_published == 0  # not checkpointed: its pages were released
    driver.submit(spec("b", prompt, 20))
    driver.run()
    b_rows = [row for plan in driver.plans for row in plan.rows if row.request_id == "b"]
    assert b_rows[0].start_pos == 12  # the three cached pages were reused
    assert driver.outcomes["b"].tokens == driver.outcomes["a"].tokens == reference(prompt, 20, window=WINDOW)
    assert_all_released(scheduler)

"""A sliding-window region with its own page ids beside a full region (gpt-oss's layers).

The fake model here has a "full layer" and a "sliding layer": every position is written through both
page tables, and the next token depends on the whole context read through the full table AND the
last `WINDOW` tokens read through the window table. A window page released while a query still
reads it (and reused), a wrong shared page on a prefix hit, or a full page released, changes the
output. Page accounting is asserted exactly after every round.
"""

from __future__ import annotations

import pytest

from helios.runtime.records.capacities import (
    Capacities, CacheGeometry, HistoryKind, HistoryRegion, PageTableView, StorageLayout,
)
from helios.errors import LoadError
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.cache.pages import PageAllocator
from helios.runtime.records.plan import PlanRow
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.cache.prefix_cache import PrefixCache, extend_chain, root_digest
from helios.runtime.records.request import RELEASED_PAGE
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.cache.window_pages import WindowPages

from .fake_model import VOCAB, FakeExecutor, next_token
from .harness import Driver, assert_all_released, spec, variants

WINDOW, PAGE_TOKENS = 6, 4
LAYOUT = StorageLayout(
    PAGE_TOKENS,
    (HistoryRegion("attention", HistoryKind.PAGED_KV),
     HistoryRegion("window", HistoryKind.SLIDING_WINDOW, window_tokens=WINDOW)),
    (PageTableView("page_table", 0, "attention"), PageTableView("window_page_table", 0, "window")),
    window_region="window",
)
NO_PREFIX = SchedulerPolicy(prefix_caching=False)


def reference(prompt, max_output: int) -> list[int]:
    context, output = list(prompt), []
    while len(output) < max_output:
        token = next_token(context + [-1] + context[-WINDOW:])
        output.append(token)
        context.append(token)
    return output


class TwoTableExecutor(FakeExecutor):
    """The fake model with a full and a sliding layer (module docstring); storage per page-id space."""

    def __init__(self, caps: Capacities):
        super().__init__(caps)
        self.window_pages = [[-1] * self.page_tokens for _ in range(caps.cache.num_window_pages)]
        self.window_tables: dict[int, list[int]] = {}

    def _table(self, row: PlanRow):
        table = super()._table(row)
        window = [] if row.admits else self.window_tables[row.slot]
        assert len(window) == row.page_table_start, "window-table upload out of order"
        window.extend(row.new_window_ids)
        self.window_tables[row.slot] = window
        assert len(window) == len(table)
        return table, window

    def _write(self, tables, position: int, token: int) -> None:
        table, window = tables
        super()._write(table, position, token)
        page = window[position // self.page_tokens]
        assert page != RELEASED_PAGE, f"write at {position} into a released window page"
        self.window_pages[page][position % self.page_tokens] = token

    def _context(self, tables, end: int) -> list[int]:
        table, window = tables
        full = [self.pages[p][i] for p in table[:-(-end // self.page_tokens)] for i in range(self.page_tokens)][:end]
        begin = max(0, end - WINDOW)
        recent = []
        for position in range(begin, end):
            page = window[position // self.page_tokens]
            assert page != RELEASED_PAGE, f"read at {position} of a released window page"
            recent.append(self.window_pages[page][position % self.page_tokens])
        return full + [-1] + recent


def caps_for(num_pages=16, num_window_pages=8, max_active=4, context=64, prefill_tokens=16, **options):
    geometry = CacheGeometry(LAYOUT, num_pages, min(num_pages, -(-context // PAGE_TOKENS)), 8, 64, b"test-model",
                             num_window_pages=num_window_pages)
    return Capacities(max_active, context, prefill_tokens, VOCAB, variants(max_active, prefill_tokens, **options),
                      geometry)


def make(policy=NO_PREFIX, **caps_options):
    caps = caps_for(**caps_options)
    scheduler = Scheduler.create(caps, policy, clock=iter(range(10**9)).__next__)
    return scheduler, Driver(scheduler, TwoTableExecutor(caps))


def window_held(req) -> list[int]:
    return [page for page in req.window_ids if page != RELEASED_PAGE]


def first_read(num_tokens: int) -> int:
    return max(0, num_tokens - WINDOW + 1) // PAGE_TOKENS


def test_the_layout_names_its_window_region_and_refuses_a_bad_one():
    assert LAYOUT.window.window_tokens == WINDOW
    assert LAYOUT.release_window == 0  # the full region keeps every page of the shared id space
    with pytest.raises(LoadError, match="no sliding window"):
        StorageLayout(4, LAYOUT.regions, LAYOUT.views, window_region="attention")
    with pytest.raises(LoadError, match="page offset"):
        StorageLayout(4, LAYOUT.regions, (PageTableView("window_page_table", 1, "window"),), window_region="window")
    with pytest.raises(LoadError, match="num_window_pages"):
        caps_for(num_window_pages=0)


def test_window_pages_are_released_and_full_pages_kept_after_every_round():
    """Prompt 5, window 6, pages of 4: after each round the full table holds every page of the
    committed history and the window table exactly the pages from (n - 5) // 4 on; the window pool
    has every other page free."""
    scheduler, driver = make(num_pages=16, num_window_pages=6)
    driver.submit(spec("a", [3, 1, 4, 1, 5], 40))
    req = scheduler.queues.requests["a"]
    pool, window_pool = scheduler.cache.pool, scheduler.cache.window.pool
    held_counts = []
    while (plan := scheduler.schedule()) is not None:
        driver.record(scheduler.complete(plan, driver.executor.run(plan)))
        scheduler.check_invariants()
        if req.slot < 0:
            break
        n = req.num_computed_tokens
        assert len(req.page_ids) == len(req.window_ids) == -(-n // PAGE_TOKENS)
        assert RELEASED_PAGE not in req.page_ids and pool.allocator.num_free == 16 - len(req.page_ids)
        assert req.num_window_released == first_read(n)
        assert req.window_ids[:first_read(n)] == [RELEASED_PAGE] * first_read(n)
        assert window_pool.allocator.num_free == 6 - len(window_held(req))
        held_counts.append(len(window_held(req)))
    assert held_counts == [2] * 39  # 40 rounds emit 40 tokens; the last one ends the request
    assert driver.outcomes["a"].tokens == reference([3, 1, 4, 1, 5], 40)
    assert pool.allocator.num_free == 16 and window_pool.allocator.num_free == 6
    assert_all_released(scheduler)


def test_concurrent_requests_share_a_window_pool_smaller_than_their_history():
    """Four 45-token requests: 48 window positions each would need 12 pages; the window pool holds
    12 for all four, and nobody waits or is preempted for it."""
    scheduler, driver = make(num_pages=48, num_window_pages=12, max_active=4)
    prompts = {f"r{i}": [i + 1, 7, i + 3, 9, 2] for i in range(4)}
    driver.submit(*(spec(name, prompt, 40) for name, prompt in prompts.items()))
    peak = 0
    while driver.step():
        peak = max(peak, 12 - scheduler.cache.window.pool.num_available)
    assert scheduler.counters().preemptions == 0 and peak <= 12
    for name, prompt in prompts.items():
        assert driver.outcomes[name].tokens == reference(prompt, 40)
    assert scheduler.cache.window.pool.allocator.num_free == 12
    assert_all_released(scheduler)


def chain_of(tokens, count):
    chain: list[bytes] = []
    extend_chain(chain, root_digest(b"test-model"), tokens, PAGE_TOKENS, count)
    return chain


@pytest.mark.parametrize("cached,expected", [
    ((1, 2), (3, 1, [11, 12])),  # a query at 12 reads positions 7.. : pages 1 and 2
    ((0, 1), (2, 0, [10, 11])),  # page 2 gone: the hit shrinks to 2 pages, whose query reads 0 and 1
    ((2,), (0, 0, [])),  # page 1 gone too: no prefix of the hit has its window cached
    ((0, 1, 2), (3, 1, [11, 12])),  # page 0 cached but out of the window: not taken
])
def test_a_prefix_hit_reuses_only_window_pages_a_query_still_reads(cached, expected):
    pool = PagePool(PageAllocator(16), PrefixCache())
    window = WindowPages(pool, WINDOW, PAGE_TOKENS, page_reuse=True)
    chain = chain_of(list(range(20)), 4)
    pages = pool.allocate(3)
    for index, page in enumerate(pages):
        if index in cached:
            pool.publish(chain[index], page)
    pool.release(list(reversed(pages)))
    ids = {page: 10 + index for index, page in enumerate(pages)}
    k, first, shared = window.reusable(chain, 3)
    assert (k, first, [ids[p] for p in shared]) == expected


def test_a_prefix_hit_shares_full_pages_and_the_window_pages_in_reach():
    scheduler, driver = make(SchedulerPolicy(), num_pages=16, num_window_pages=8)
    prompt = list(range(30, 43))  # 13 tokens: 3 complete pages, one recomputed token
    driver.submit(spec("a", prompt, 20))
    a = scheduler.queues.requests["a"]
    driver.step()
    a_pages, a_window = list(a.page_ids), list(a.window_ids)
    driver.run()
    window_cache = scheduler.cache.window.pool.cache
    assert all(window_cache.is_parked(page) for page in a_window[:3])  # released while running: parked
    driver.submit(spec("b", prompt, 20))
    b = scheduler.queues.requests["b"]
    driver.step()
    (row,) = [row for row in driver.plans[-1].rows if row.request_id == "b"]
    assert row.start_pos == 12 and b.page_ids[:3] == a_pages[:3]  # every full page of the hit
    # A query at 12 reads positions 7..12: window pages 1 and 2 shared, page 0 never held.
    assert b.window_ids[:3] == [RELEASED_PAGE, a_window[1], a_window[2]]
    assert row.new_window_ids[:3] == (RELEASED_PAGE, a_window[1], a_window[2])
    assert b.num_window_released == 1
    driver.run()
    assert driver.outcomes["b"].tokens == driver.outcomes["a"].tokens == reference(prompt, 20)
    assert_all_released(scheduler)


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_preempted_request_is_recomputed_never_checkpointed(mode, prefix_caching):
    """A window layout takes no snapshots (released pages are gone): preempted under either mode the
    request recomputes (from what both prefix caches still hold) and generates the same tokens."""
    scheduler, driver = make(SchedulerPolicy(preemption=mode, prefix_caching=prefix_caching),
                             num_pages=8, num_window_pages=12, context=32)
    driver.submit(spec("low", [3, 1, 4, 1, 5], 18, priority=5))
    low = scheduler.queues.requests["low"]
    while low.num_computed_tokens < 14:
        driver.step()
    assert low.num_window_released == 2 and len(low.page_ids) == 4
    high = {"h0": [40, 41, 42, 43, 44], "h1": [41, 42, 43, 44, 45]}
    driver.submit(*(spec(name, prompt, 8) for name, prompt in high.items()))  # they outgrow the full pool
    driver.run()
    assert low.num_preemptions >= 1 and scheduler.cache.snapshots.num_published == 0
    readmitted = [row for plan in driver.plans for row in plan.rows if row.request_id == "low" and row.admits]
    assert len(readmitted) == low.num_preemptions + 1 and all(row.start_pos % PAGE_TOKENS == 0 for row in readmitted)
    if prefix_caching:  # readmitted past the 2 full pages whose window pages (0 and 1) parked in reach
        assert [row.start_pos for row in readmitted] == [0, 8]
    else:
        assert [row.start_pos for row in readmitted] == [0] * len(readmitted)
    assert driver.executor.num_copies == 0  # nothing restored: recomputed
    assert driver.outcomes["low"].tokens == reference([3, 1, 4, 1, 5], 18)
    for name, prompt in high.items():
        assert driver.outcomes[name].tokens == reference(prompt, 8)
    assert scheduler.cache.window.pool.allocator.num_free + scheduler.cache.window.pool.cache.num_parked == 12
    assert_all_released(scheduler)


def test_speculative_rounds_release_only_committed_history():
    """Speculative lanes write proposals past the committed history (rejected positions hold garbage);
    window pages go only by the committed count, so rollback never loses a page a query reads."""
    scheduler, driver = make(num_pages=24, num_window_pages=12, speculative=(3, 4))
    prompts = {"a": [3, 1, 4, 1, 5], "b": [2, 7, 1, 8, 2, 8, 1]}
    driver.submit(*(spec(name, prompt, 30) for name, prompt in prompts.items()))
    driver.run()
    assert any(plan.operation.name == "SPECULATIVE" for plan in driver.plans)
    for name, prompt in prompts.items():
        assert driver.outcomes[name].tokens == reference(prompt, 30)
    assert scheduler.cache.window.pool.allocator.num_free == 12
    assert_all_released(scheduler)

"""Whole-state consistency checks of the scheduler (run after every step in tests).

Checked: every page is exactly one of free, parked (cached, unreferenced) or referenced, and its
reference count equals the number of holders (request page tables, snapshots, fenced copies);
nothing leaks; every slot is free or owned by exactly one request; in-flight counters equal what
the plans in flight say; queued requests hold no pages or slot; running page tables cover their
frontier; continuation rows and host slots are free or owned once.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from helios.runtime.cache.cache_manager import CacheManager
from helios.runtime.records.capacities import Capacities, StorageLayout
from helios.runtime.records.faults import require
from helios.runtime.records.plan import StepPlan
from helios.runtime.scheduling.queues import RequestQueues
from helios.runtime.records.request import RequestState, RequestStatus
from helios.runtime.scheduling.slots import SlotTable


def check_state(caps: Capacities, cache: CacheManager, slots: SlotTable, queues: RequestQueues,
                flights: Sequence[tuple[StepPlan, list[RequestState]]]) -> None:
    cache.pool.cache.check()
    cache.snapshots.check()
    requests = list(queues.requests.values())
    _check_pages(cache, requests)
    _check_slots(slots, requests)
    _check_requests(caps, queues, requests, flights)


def _check_pages(cache: CacheManager, requests: list[RequestState]) -> None:
    _check_pool(cache.pool, Counter(cache.page_holders(requests)))
    if cache.window is not None:  # the window region's own page ids: held by request tables only
        cache.window.pool.cache.check()
        _check_pool(cache.window.pool, Counter(cache.window.holders(requests)))


def _check_pool(pool, holders: Counter) -> None:
    allocator, prefix = pool.allocator, pool.cache
    num_free = num_parked = 0
    for page in range(allocator.num_pages):
        refs = allocator.ref_count(page)
        require(refs == holders[page], f"page {page}: {refs} references, {holders[page]} holders")
        if allocator.is_free(page):
            num_free += 1
            require(refs == 0 and not prefix.is_cached(page), f"free page {page} is referenced or cached")
        elif prefix.is_parked(page):
            num_parked += 1
            require(refs == 0, f"parked page {page} is referenced")
        else:
            require(refs > 0, f"page {page} leaked: not free, not parked, not referenced")
    require(num_free == allocator.num_free, "the free list holds a page twice")
    require(num_parked == prefix.num_parked, "a parked page is not a page")


def _check_slots(slots: SlotTable, requests: list[RequestState]) -> None:
    owners: dict[int, str] = {}
    for req in requests:
        if req.slot < 0:
            continue
        require(req.slot not in owners, f"slot {req.slot} owned by {owners.get(req.slot)} and {req.request_id}")
        owners[req.slot] = req.request_id
        require(slots.owner(req.slot) == req.request_id, f"slot {req.slot} table disagrees")
    free = slots.free_slots()
    require(not free & owners.keys(), "a slot is both free and owned")
    require(len(free) + len(owners) == slots.num_slots, "a slot leaked")


def _check_released(layout: StorageLayout, req: RequestState) -> None:
    """Released entries are exactly the leading ones, already uploaded, and outside the window."""
    name, count = req.request_id, req.num_released_pages
    require(all(page < 0 for page in req.page_ids[:count]), f"{name}: a released page is still held")
    require(all(page >= 0 for page in req.page_ids[count:]), f"{name}: a held page is marked released")
    require(count <= req.num_uploaded_pages, f"{name}: released a page never uploaded")
    require(count <= layout.releasable_pages(req.num_computed_tokens), f"{name}: released a page inside the window")
    window = layout.window
    if window is None:
        require(not req.window_ids, f"{name}: a window table without a window region")
        return
    count = req.num_window_released
    require(len(req.window_ids) == len(req.page_ids), f"{name}: the window table and the page table differ in length")
    require(all(page < 0 for page in req.window_ids[:count]), f"{name}: a released window page is still held")
    require(all(page >= 0 for page in req.window_ids[count:]), f"{name}: a held window page is marked released")
    first_read = max(0, req.num_computed_tokens - window.window_tokens + 1) // layout.page_tokens
    require(count <= first_read, f"{name}: released a window page a later query reads")


def _check_requests(caps: Capacities, queues: RequestQueues, requests: list[RequestState],
                    flights: Sequence[tuple[StepPlan, list[RequestState]]]) -> None:
    plans = Counter()
    tokens = Counter()
    samples = Counter()
    for plan, members in flights:
        for row, req in zip(plan.rows, members):
            plans[req.request_id] += 1
            tokens[req.request_id] += row.query_len
            samples[req.request_id] += row.samples
    waiting, running = set(map(id, queues.waiting)), set(map(id, queues.running))
    layout = caps.cache.layout
    for req in requests:
        name = req.request_id
        require(req.num_inflight_plans == plans[name], f"{name}: in-flight plan count")
        require(req.num_inflight_tokens == tokens[name], f"{name}: in-flight token count")
        require(req.num_pending_samples == samples[name], f"{name}: pending sample count")
        require((id(req) in waiting) == (req.status == RequestStatus.WAITING), f"{name}: waiting queue")
        require((id(req) in running) == (req.status == RequestStatus.RUNNING), f"{name}: running queue")
        if req.status == RequestStatus.WAITING:
            require(req.slot < 0 and not req.page_ids and not req.window_ids and req.num_inflight_plans == 0,
                    f"{name}: queued with resources")
        if req.status == RequestStatus.RUNNING:
            require(req.slot >= 0, f"{name}: running without a slot")
            require(len(req.page_ids) >= layout.pages_for(req.frontier), f"{name}: pages do not cover the frontier")
            require(req.num_computed_tokens <= len(req.token_ids), f"{name}: computed beyond known tokens")
            _check_released(layout, req)
        if req.status == RequestStatus.FINISHED:
            require(req.num_inflight_plans > 0, f"{name}: finished and fenced but not released")
    require(len(queues.waiting) + len(queues.running) <= len(requests), "a queue holds a released request")

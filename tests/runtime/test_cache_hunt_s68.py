"""Regressions found hunting the page cache, prefix cache, snapshots and host offload."""

from __future__ import annotations

import pytest

from helios.errors import LoadError
from helios.runtime.records.capacities import (CacheGeometry, Capacities, HistoryKind, HistoryRegion, PageTableView,
                                               StorageLayout)
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import VOCAB, FakeExecutor, reference
from .harness import Driver, assert_all_released, make, spec, variants

IMAGE_A, IMAGE_B = -111, -222  # image feature token keys (`RequestImages.token_keys`): content hashes


@pytest.mark.parametrize("stateful", [True, False], ids=["prompt-snapshot", "final-snapshot"])
@pytest.mark.parametrize("image", [IMAGE_A, IMAGE_B], ids=["same-image", "other-image"])
def test_a_snapshot_tail_of_image_tokens_is_reused_only_for_the_same_image(stateful, image):
    """Prompt [1..5] with an image's feature token at position 4, the partial page of 4-token pages:
    a hybrid model publishes a snapshot at its prompt boundary, a paged one its final state (one
    output: endpoint 5). A later prompt with the same placeholder ids there restores that state only
    when its image is the same one (its tail is compared keyed, as the page chain is)."""
    scheduler, driver = make(stateful=stateful, max_active=2, num_pages=32)
    first = [1, 2, 3, 4, 5]
    driver.submit(spec("a", first, 3 if stateful else 1, token_keys=((4, IMAGE_A),), publish_snapshot=not stateful))
    driver.run()
    assert scheduler.counters().snapshots_published == 1
    follow = first + [6, 7, 8, 9]
    driver.submit(spec("b", follow, 3, token_keys=((4, image),)))
    driver.run()
    reused = driver.outcomes["b"].finish.num_reused_tokens
    assert reused == (5 if image == IMAGE_A else 0 if stateful else 4)  # paged: page 0 from the prefix cache
    assert scheduler.counters().snapshots_restored == (1 if image == IMAGE_A else 0)
    assert driver.outcomes["b"].tokens == reference(follow, 3, stateful=stateful)
    assert_all_released(scheduler)


def shifted_view_scheduler(max_active: int = 4, num_pages: int = 64):
    """Pages of 4 tokens with a view that references one page past the frontier (a shifted draft
    view: `PageTableView.page_offset` 1), so every table holds one more page than its positions."""
    layout = StorageLayout(4, (HistoryRegion("kv", HistoryKind.PAGED_KV),), (PageTableView("kv", 1),))
    geometry = CacheGeometry(layout, num_pages, 17, 8, 16, b"test-model")
    caps = Capacities(max_active, 64, 16, VOCAB, variants(max_active, 16), geometry)
    scheduler = Scheduler.create(caps, SchedulerPolicy(), clock=iter(range(10**9)).__next__)
    return scheduler, Driver(scheduler, FakeExecutor(caps))


@pytest.mark.parametrize("prompt_len", [2, 5, 6], ids=["first-page", "last-token-starts-a-page", "mid-page"])
def test_a_member_admitted_onto_a_shared_prompt_gets_the_lookahead_page(prompt_len):
    """The choices of one request share its prompt (`prompt_sharing`); a member's table must hold
    the page of the last prompt token and the page the shifted view references after it."""
    scheduler, driver = shifted_view_scheduler()
    prompt = list(range(5, 5 + prompt_len))
    driver.submit(*(spec(name, prompt, 4) for name in "abc"))
    driver.step()  # a prefills; b and c wait for it
    driver.step()
    driver.step()  # b and c admitted onto a's prompt
    members = [scheduler.queues.requests[name] for name in "bc"]
    assert scheduler.cache.groups.num_shared_admissions == 2
    assert all(len(req.page_ids) == scheduler.caps.cache.layout.pages_for(req.frontier) for req in members)
    driver.run()
    for name in "abc":
        assert driver.outcomes[name].tokens == reference(prompt, 4), name
    assert_all_released(scheduler)


@pytest.mark.parametrize("field, value", [("num_continuation_rows", -1), ("num_host_slots", -2),
                                          ("num_window_pages", -1), ("queue_capacity", 0)])
def test_a_negative_pool_or_empty_queue_is_refused_at_start(field, value):
    """Capacities built in process (not through the flags, which refuse these) with a negative
    snapshot-row, host-slot or window-page count or no queue: a `LoadError` at start, not a pool
    that silently holds nothing (every offload falling back, every request rejected)."""
    geometry = dict(num_continuation_rows=8, num_host_slots=16, num_window_pages=0)
    queue = 0 if field == "queue_capacity" else 8
    if field != "queue_capacity":
        geometry[field] = value
    layout = StorageLayout(4)
    with pytest.raises(LoadError, match=field):
        Capacities(4, 64, 16, VOCAB, variants(4, 16),
                   CacheGeometry(layout, 16, 16, geometry["num_continuation_rows"], geometry["num_host_slots"],
                                 b"test-model", geometry["num_window_pages"]), queue_capacity=queue)

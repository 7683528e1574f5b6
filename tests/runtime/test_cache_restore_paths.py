"""Restore paths of the cache: which snapshot a readmitted request restores, and when a restore
counts (on a layout with recurrent state, where snapshots are the only prefix reuse)."""

from __future__ import annotations

import random

import pytest

from helios.runtime.cache.snapshots import FenceKind, Residence
from helios.runtime.records.plan import StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy

from .fake_model import reference
from .harness import assert_all_released, make, spec

CONT, STATE = StorageKind.CONTINUATION, StorageKind.STATE

PROMPT = list(range(40, 46))


def published_prompt():
    """A scheduler whose snapshot store holds the published state of PROMPT (request "p" ended)."""
    scheduler, driver = make(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD), stateful=True)
    driver.submit(spec("p", PROMPT, 2))
    driver.run()
    assert [(s.endpoint, s.owner, s.ready) for s in scheduler.cache.snapshots.snapshots()] == [(6, None, True)]
    return scheduler, driver


@pytest.mark.parametrize("capture", ["in flight", "failed"])
def test_a_readmission_without_its_private_snapshot_restores_a_published_one(capture):
    """"c" (PROMPT, then one generated token) is preempted to a private host snapshot; readmitted
    while that capture is still being copied, or after it failed, it restores PROMPT's published
    state and computes one token, not all seven from position 0."""
    scheduler, driver = published_prompt()
    driver.submit(spec("c", PROMPT, 6))
    driver.step()
    driver.step()  # c's prompt ran: its history is PROMPT and one token
    c, cache = scheduler.queues.requests["c"], scheduler.cache
    assert len(c.token_ids) == 7 and c.num_computed_tokens == 6
    work = cache.checkpoint(c, Residence.HOST)  # as a preemption does, keeping c's slot
    assert work is not None and c.snapshot_id
    c.num_computed_tokens = 0
    if capture == "failed":
        cache.snapshots.settle(c.snapshot_id, FenceKind.CAPTURE, False)
    tokens, restore = cache.admit(c, 16)
    assert (c.num_computed_tokens, tokens) == (6, 1)
    assert [kind for _, kind in restore.fences] == [FenceKind.RESTORE] and c.snapshot_id == 0


@pytest.mark.parametrize("fails", [False, True])
def test_a_restore_counts_once_its_copies_completed(fails):
    """"q" extends PROMPT: its admission restores PROMPT's published state. The restore counts
    (`snapshots_restored`, a metric) when the plan that carries its copies completes; a plan that
    fails restored nothing."""
    scheduler, driver = published_prompt()
    carried = []

    def fail_restore(plan):
        if any(copy.src.kind.name == "CONTINUATION" for copy in plan.copies):
            carried.append(plan.sequence)
            return fails
        return False

    driver.fail_next = fail_restore
    driver.submit(spec("q", PROMPT + [7], 3))
    driver.run()
    assert len(carried) == 1
    assert scheduler.counters().snapshots_restored == (0 if fails else 1)
    assert driver.outcomes["q"].finish.reason.name == ("ERROR" if fails else "LENGTH")
    assert_all_released(scheduler)


def test_a_private_snapshot_waits_for_a_continuation_row_instead_of_being_recomputed():
    """On a core with state programs a preempted request's state comes back through a continuation
    row. "a" and "b", preempted to private host snapshots, are readmitted in one step with one row:
    "a"'s restore holds it, so "b" waits (not admitted, its snapshot kept) rather than dropping its
    snapshot and recomputing its seven tokens; once "a"'s restore settled, "b" restores. Nothing
    else holds the row then: a row is busy only while a plan in flight or being built copies through
    it, so the wait ends at that plan's fence."""
    scheduler, driver = make(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD, prefix_caching=False),
                             stateful=True, programs=True, rows=1)
    driver.submit(spec("a", PROMPT, 6), spec("b", list(range(60, 66)), 6))
    driver.step()
    driver.step()  # their prompts ran: each history is a prompt and one token
    cache = scheduler.cache
    a, b = scheduler.queues.requests["a"], scheduler.queues.requests["b"]
    for req in (a, b):  # as a preemption does, keeping the slots
        work = cache.checkpoint(req, Residence.HOST)
        assert work is not None and req.snapshot_id
        cache.snapshots.settle(req.snapshot_id, FenceKind.CAPTURE, True)  # the capture's row is free again
        req.num_computed_tokens = 0
    _, restore = cache.admit(a, 16)
    assert a.num_computed_tokens == 6 and [kind for _, kind in restore.fences] == [FenceKind.RESTORE]
    private = b.snapshot_id
    assert cache.admit(b, 16) is None  # the one row is "a"'s until its restore settles
    assert b.snapshot_id == private and cache.snapshots.get(private).ready and b.page_ids == []
    cache.snapshots.settle(restore.fences[0][0], FenceKind.RESTORE, True)
    tokens, restore = cache.admit(b, 16)
    assert (b.num_computed_tokens, tokens) == (6, 1) and restore.fences == ((private, FenceKind.RESTORE),)


def test_every_preempted_requests_state_comes_back_through_the_one_continuation_row():
    """Drawn workloads on a core with state programs and one continuation row, under OFFLOAD
    preemption: every private capture that took the row (a SNAPSHOT copy, slot state into it) is
    restored (a RESTORATION copy back) whatever else held the row at its readmission, the
    scheduler drains (a wait for the row never stalls it) and the tokens are the reference's."""
    num_captured = 0
    for seed in range(12):
        scheduler, driver = make(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD, prefix_caching=False),
                                 stateful=True, programs=True, rows=1, num_pages=8, max_active=4)
        draw = random.Random(seed)
        specs = [spec(f"r{i}", [draw.randrange(1, 90) for _ in range(draw.randrange(3, 12))], draw.randrange(4, 12))
                 for i in range(4)]
        driver.submit(*specs)
        outcomes = driver.run()
        for item in specs:
            assert outcomes[item.request_id].tokens == reference(item.prompt_ids, item.max_output_tokens, stateful=True)
        copies = [copy for plan in driver.plans for copy in plan.copies]
        captured = sum(copy.src.kind == STATE and copy.dst.kind == CONT for copy in copies)
        restored = sum(copy.src.kind == CONT and copy.dst.kind == STATE for copy in copies)
        assert captured == restored, f"seed {seed}: {captured - restored} private snapshots were recomputed"
        assert_all_released(scheduler)
        num_captured += captured
    assert num_captured >= 12  # the draws preempt

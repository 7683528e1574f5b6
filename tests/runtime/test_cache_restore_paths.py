"""Restore paths of the cache: which snapshot a readmitted request restores, and when a restore
counts (on a layout with recurrent state, where snapshots are the only prefix reuse)."""

from __future__ import annotations

import pytest

from helios.runtime.cache.snapshots import FenceKind, Residence
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy

from .harness import assert_all_released, make, spec

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

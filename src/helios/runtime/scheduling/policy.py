"""Scheduling policy choices, fixed at startup (immutable after validation)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PreemptionMode(enum.IntEnum):
    RECOMPUTE = 1  # drop the victim's pages (complete ones stay cached) and recompute later
    # checkpoint the victim to host slots and restore it later; recompute if short (of host slots, or on a
    # core with state programs of a continuation row its state goes through: `helios.runtime.cache.snapshots`)
    OFFLOAD = 2


@dataclass(frozen=True)
class SchedulerPolicy:
    """How the scheduler uses its capacities.

    `two_frames`: let compatible decode rounds occupy both execution frames.
    `speculative`: use SPECULATIVE programs for all-decode cohorts when loaded.
    `offload_watermark_pages`: when fewer pages than this are free or evictable, move the least
    recently used published snapshot to host slots (its pages return after the copy's fence).
    """

    preemption: PreemptionMode = PreemptionMode.RECOMPUTE
    prefix_caching: bool = True
    two_frames: bool = True
    speculative: bool = True
    offload_watermark_pages: int = 0

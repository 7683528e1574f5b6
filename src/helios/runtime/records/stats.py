"""Counters and gauges of the model worker, read by the server's /metrics collector.

Only the model worker thread mutates a `WorkerStats`; readers take `snapshot()`, a frozen copy.
Labels are operation names and terminal reasons only: never request ids, prompts or token ids.

Request counts are the engine's: one engine request per choice of a response, so
`requests_finished`, `prompt_tokens` (a prompt once per choice, counted at admission) and
`generated_tokens` (tokens the device generated, including a late stop's overrun that the engine
ended first and the token ``max_tokens: 0`` samples and hides) are not what the responses' usage
says. The server's /metrics counts those from the responses instead (`helios.server.request_metrics`).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class StatsSnapshot:
    requests_admitted: int
    requests_rejected: int
    requests_finished: Mapping[str, int]
    graph_launches: Mapping[str, int]
    prompt_tokens: int
    generated_tokens: int
    prefix_lookup_tokens: int
    prefix_reused_tokens: int
    snapshots_published: int
    snapshots_evicted: int
    pages_total: int
    pages_free: int
    pages_cached: int
    active_requests: int
    queued_requests: int
    request_slots: int
    mixed_grammar_decode_steps: int
    constrained_max_inflight: int
    second_frames: int
    healthy: bool
    snapshots_restored: int = 0
    image_cache_hits: int = 0  # images whose features came from the content-hash cache
    image_cache_misses: int = 0  # images encoded by a VISION program
    window_pages_total: int = 0  # pages of a window region with its own page ids (0: none)
    window_pages_free: int = 0
    window_pages_cached: int = 0


@dataclass
class WorkerStats:
    """Mutable counters owned by the model worker thread."""

    requests_admitted: int = 0
    requests_rejected: int = 0
    requests_finished: Counter = field(default_factory=Counter)
    graph_launches: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefix_lookup_tokens: int = 0
    prefix_reused_tokens: int = 0
    snapshots_published: int = 0
    snapshots_evicted: int = 0
    pages_total: int = 0
    pages_free: int = 0
    pages_cached: int = 0
    active_requests: int = 0
    queued_requests: int = 0
    request_slots: int = 0
    mixed_grammar_decode_steps: int = 0
    constrained_max_inflight: int = 0
    second_frames: int = 0  # plans submitted while another was still in flight
    image_cache_hits: int = 0
    image_cache_misses: int = 0
    healthy: bool = True
    snapshots_restored: int = 0
    window_pages_total: int = 0
    window_pages_free: int = 0
    window_pages_cached: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_constrained_submission(self, inflight_frames: int) -> None:
        """Called right after a successful submission that includes a constrained request."""
        self.constrained_max_inflight = max(self.constrained_max_inflight, inflight_frames)

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            values = {
                name: getattr(self, name)
                for name in StatsSnapshot.__dataclass_fields__
            }
        values["requests_finished"] = MappingProxyType(dict(values["requests_finished"]))
        values["graph_launches"] = MappingProxyType(dict(values["graph_launches"]))
        return StatsSnapshot(**values)

"""`StallWatch`: whether a model worker is stuck inside a step, from samples of its progress.

A sample is the worker's completed-round count (`Engine.progress`) and whether requests are pending
(`Engine.has_pending`), taken at a monotonic time: from the engine process's heartbeats
(`helios.runtime.engine_link`), or read off an in-process engine whenever `/health` or `/metrics`
asks (`helios.server.service`). The worker counts as stalled when the samples showed requests
pending at one unchanged count for longer than the timeout. Only what the samples showed counts,
never the time since the latest one, so a gap between samples cannot fake a stall; a sample whose
count moved, or that shows nothing pending, clears it (an idle engine is never stalled).
"""

from __future__ import annotations

# No heartbeat for this long: unresponsive; requests pending and no round completed for this long:
# stalled (far past a long prefill or compile). Here, in a module that imports no torch, for the
# command line's help.
DEFAULT_LIVENESS_TIMEOUT_S = 60.0


class StallWatch:
    """Samples of one worker's progress; `reason` says why it is stalled, or None. One writer; a
    reader on another thread sees whole states (each a single attribute)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._progress: int | None = None  # the latest sample's count
        # (first, latest) times of the samples showing requests pending at the latest count (None: none pending)
        self._still: tuple[float, float] | None = None

    def observe(self, progress: int, has_pending: bool, now: float) -> None:
        """Takes a sample taken at `now` (monotonic seconds)."""
        still = self._still
        if not has_pending:
            self._still = None
        elif still is None or progress != self._progress:
            self._still = (now, now)
        else:
            self._still = (still[0], now)
        self._progress = progress

    @property
    def shows_pending(self) -> bool:
        """Whether the latest sample showed requests pending."""
        return self._still is not None

    @property
    def reason(self) -> str | None:
        """Why the worker counts as stalled (requests pending and no round completed for more than
        `timeout_s`, as the samples showed), or None."""
        still = self._still  # one read: the writer replaces it whole
        if still is None:
            return None
        still_s = still[1] - still[0]
        if still_s <= self.timeout_s:
            return None
        return (f"the model worker has completed no step for {still_s:.1f} s (more than {self.timeout_s:g} s) "
                "with requests pending: a step is stuck (a device sync, a collective or a native call that "
                "does not return)")

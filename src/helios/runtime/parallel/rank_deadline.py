"""A deadline on each step of a rank whose collectives run on the device.

Gloo collectives wait on the host under the group's timeout, so a lost rank surfaces as a
`CollectiveError` by itself. NCCL collectives do not: the program only enqueues them (they may be
replayed from a CUDA graph, where NCCL's own watchdog never sees them), and a collective whose
peer is gone spins on the device until its communicator is aborted, leaving the host blocked in
whatever synchronises next (reading the completion record). `StepDeadline` is that abort: the
rank arms it around one step (its program run and the cohort agreement); if the step has not
finished when the deadline passes, a watcher thread calls `abort` (``RankGroup.abort``), the
waiting collectives end, and the step raises `CollectiveError`, which breaks the group the way a
gloo timeout does.

The deadline is the group's collective timeout, for a whole step: a step runs many collectives,
but a healthy step takes milliseconds, and programs are captured (Triton kernels compiled) at
startup, not in a step.

Thread ownership: `guard` on the thread that runs steps (one step at a time); the watcher thread
is owned by the deadline until `close`. After it fired once the deadline stays expired: the group
is aborted and no later step can use it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from helios.abi.collectives import CollectiveError


class StepDeadline:
    """Aborts the group when a guarded step outlives `timeout_s` (see the module docstring)."""

    def __init__(self, timeout_s: float, abort: Callable[[], None], name: str = "helios-step-deadline"):
        self._timeout_s = timeout_s
        self._abort = abort
        self._condition = threading.Condition()
        self._deadline: float | None = None  # armed: monotonic time at which the step expires
        self._expired = False
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, name=name, daemon=True)
        self._watcher.start()

    @property
    def expired(self) -> bool:
        return self._expired

    @contextlib.contextmanager
    def guard(self, step: str) -> Iterator[None]:
        """Runs the body under the deadline; raises `CollectiveError` when it expired meanwhile
        (also when the body failed because the abort ended its collectives)."""
        with self._condition:
            if self._expired:
                raise self._error(step)
            self._deadline = time.monotonic() + self._timeout_s
            self._condition.notify()
        try:
            yield
        except BaseException as error:
            if self._disarm():
                raise self._error(step) from error
            raise
        if self._disarm():
            raise self._error(step)

    def close(self) -> None:
        """Stops the watcher (a step still guarded is no longer bounded). Idempotent."""
        with self._condition:
            self._closed = True
            self._condition.notify()

    def _disarm(self) -> bool:
        with self._condition:
            self._deadline = None
            return self._expired

    def _error(self, step: str) -> CollectiveError:
        return CollectiveError(f"{step} did not finish within the collective timeout ({self._timeout_s:g} s): "
                               "a rank is lost or stopped answering; the device group was aborted")

    def _watch(self) -> None:
        with self._condition:
            while not self._closed:
                if self._deadline is None:
                    self._condition.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._condition.wait(remaining)
                    continue
                self._expired, self._deadline = True, None
                break
            else:
                return
        self._abort()  # outside the lock: aborting may block until the communicator is torn down

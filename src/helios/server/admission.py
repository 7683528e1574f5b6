"""HTTP admission: bounded permits and frontend preparation slots.

At most `queue_capacity + max_active` requests hold a permit at once; that counts CPU preparation,
queued generation and finished responses whose reader has not yet released them. A request that
finds no permit gets `OverloadedError` (HTTP 429) at once. A request of several choices takes its
permits all at once or none (`acquire_many`); one that asks for more than there are could never be
admitted, so it is a `BeyondPermits` (HTTP 400), not a 429 that no retry would get past. Admitted requests then wait
asynchronously for one of `frontend_workers` preparation slots (`helios.server.preparation`).

Invariants: `in_use` equals the number of unreleased permits; a permit is released exactly once
(releasing twice is a no-op), so a response can release it from any of its exit paths.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from helios.errors import OverloadedError, RequestError


class IngressFull(OverloadedError):
    """Every admission permit is held."""


class BeyondPermits(RequestError):
    """A request of more choices than the server has admission permits (it can never be admitted)."""


@dataclass(frozen=True)
class AdmissionLimits:
    max_active: int
    queue_capacity: int
    frontend_workers: int

    @property
    def num_permits(self) -> int:
        return self.max_active + self.queue_capacity


class Permit:
    """One admitted request's claim on ingress capacity; `release()` is idempotent."""

    __slots__ = ("_controller", "_released")

    def __init__(self, controller: "AdmissionController"):
        self._controller = controller
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._controller._give_back()


class AdmissionController:
    """Counts permits (thread-safe)."""

    def __init__(self, limits: AdmissionLimits):
        self.limits = limits
        self._lock = threading.Lock()
        self._in_use = 0

    @property
    def in_use(self) -> int:
        return self._in_use

    def acquire(self) -> Permit:
        """Returns a permit or raises `IngressFull`; never waits."""
        with self._lock:
            if self._in_use >= self.limits.num_permits:
                raise IngressFull(
                    f"server is at capacity ({self.limits.num_permits} admitted requests); retry later"
                )
            self._in_use += 1
        return Permit(self)

    def acquire_many(self, count: int, param: str | None = None) -> list[Permit]:
        """`count` permits at once, or `IngressFull` with none taken; never waits. `BeyondPermits`
        (naming `param`) when `count` exceeds every permit there is."""
        total = self.limits.num_permits
        if count > total:
            raise BeyondPermits(f"the request has {count} choices (n times the prompts), each an engine request "
                                f"holding an admission permit, and this server admits at most {total} at once; "
                                "ask for fewer", param)
        with self._lock:
            if self._in_use + count > total:
                raise IngressFull(f"server is at capacity ({total} admitted requests); retry later")
            self._in_use += count
        return [Permit(self) for _ in range(count)]

    def _give_back(self) -> None:
        with self._lock:
            self._in_use -= 1

"""The scheduler's request collections, each kept in scheduling order.

Order everywhere is `RequestState.order_key`: most important priority first, then submission
order. A preempted request keeps its key, so it returns ahead of everything submitted after it.
`requests` holds every request whose resources are not yet released (queued, running, or
finished but still named by a plan in flight). `num_awaiting` counts the queued requests that may
be admitted onto a prompt group's pages, by group key (`prompt_sharing.waiting_key`).
"""

from __future__ import annotations

import bisect
from collections import Counter

from helios.runtime.cache.prompt_sharing import waiting_key
from helios.runtime.records.request import RequestState, RequestStatus


def _key(req: RequestState) -> tuple[int, int]:
    return req.order_key


class RequestQueues:
    def __init__(self) -> None:
        self.waiting: list[RequestState] = []
        self.running: list[RequestState] = []
        self.requests: dict[str, RequestState] = {}
        self.num_awaiting: Counter[bytes] = Counter()

    def add(self, req: RequestState) -> None:
        """A newly submitted request joins the waiting queue."""
        self.requests[req.request_id] = req
        self.enqueue(req)

    def enqueue(self, req: RequestState) -> None:
        req.status = RequestStatus.WAITING
        bisect.insort(self.waiting, req, key=_key)
        key = waiting_key(req)
        if key:
            self.num_awaiting[key] += 1

    def start(self, req: RequestState) -> None:
        """Move an admitted request from waiting to running."""
        self.waiting.remove(req)
        self._unawait(req)
        req.status = RequestStatus.RUNNING
        bisect.insort(self.running, req, key=_key)

    def leave(self, req: RequestState) -> None:
        """Take a request out of whichever queue holds it (it stays in `requests`)."""
        queue = self.running if req.status == RequestStatus.RUNNING else self.waiting
        if req in queue:
            queue.remove(req)
            if queue is self.waiting:
                self._unawait(req)

    def _unawait(self, req: RequestState) -> None:
        key = waiting_key(req)
        if key:
            self.num_awaiting[key] -= 1
            if not self.num_awaiting[key]:
                del self.num_awaiting[key]

    def forget(self, req: RequestState) -> None:
        del self.requests[req.request_id]

"""Frontend output workers: per-request output work off the model worker thread.

The model worker hands each round's events to `OutputWorkers.post` (the engine's sink) as one
`StepBatch`; `post` only routes them, by request id, onto the queues of a few worker threads and
wakes each worker that got something (one lock and one wakeup per worker per round, nothing per
token). The workers run each request's `OutputConsumer` (detokenizing, stop strings, tool and
reasoning parsing, logprob entries, presentation handoff) while the model worker packs and runs
the next step. A request is bound to one worker when it is registered, so its events are consumed in
order by one thread at a time; a slow request delays only the requests that share its worker, and
never the model worker.

A consumer that raises ends only its own request: the worker calls its `on_failure` with the
error and the event it failed on (the consumer ends the response with an error and cancels the
request in the engine) and goes on with the other requests. A request's route is dropped after its
`FinishEvent` was consumed; events of unregistered requests are dropped.

`register` happens before the request is submitted to the engine (from any thread); `post` is
called by the model worker only. Routes live in a dict read by `post` and written by `register` and
the workers: single dict operations, atomic in CPython.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Protocol

from helios.runtime.records.events import FinishEvent, RequestEvent
from helios.runtime.outlet import StepBatch


class OutputConsumer(Protocol):
    """One request's output side, driven by one output worker."""

    def on_event(self, event: RequestEvent) -> None: ...

    def on_failure(self, error: Exception, event: RequestEvent) -> None: ...


class _Worker:
    """One output thread and its queue of (consumer, event) items."""

    def __init__(self, name: str, routes: dict[str, tuple[_Worker, OutputConsumer]]):
        self._routes = routes
        self._wake = threading.Condition()
        self._items: deque[tuple[OutputConsumer, RequestEvent]] = deque()
        self._is_running = True
        self.num_consumed = 0  # events consumed so far (tests and benchmarks read it)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, items: list[tuple[OutputConsumer, RequestEvent]]) -> None:
        """Queues `items`; after `stop` (a request ended by a closed engine) consumes them here."""
        with self._wake:
            is_running = self._is_running
            if is_running:
                was_empty = not self._items
                self._items.extend(items)
                if was_empty:
                    self._wake.notify()
        if not is_running:
            for consumer, event in items:
                self._consume(consumer, event)

    def stop(self, timeout: float) -> None:
        """Ends the thread once the queue is empty."""
        with self._wake:
            self._is_running = False
            self._wake.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while self._is_running and not self._items:
                    self._wake.wait()
                if not self._items:
                    return
                items, self._items = self._items, deque()
            for consumer, event in items:
                self._consume(consumer, event)

    def _consume(self, consumer: OutputConsumer, event: RequestEvent) -> None:
        try:
            consumer.on_event(event)
        except Exception as error:  # noqa: BLE001 - one request's output failure ends that request only
            try:
                consumer.on_failure(error, event)
            except Exception:  # noqa: BLE001 - nothing more can be done for it
                pass
        if isinstance(event, FinishEvent):
            self._routes.pop(event.request_id, None)
        self.num_consumed += 1


class OutputWorkers:
    """See the module docstring. `close` stops the threads after their queues drained; events
    posted later (the answer a closed engine gives a late submission) are consumed by the caller."""

    def __init__(self, num_workers: int = 2, name: str = "helios-output"):
        if num_workers < 1:
            raise ValueError(f"{num_workers} output workers")
        self._routes: dict[str, tuple[_Worker, OutputConsumer]] = {}
        self._workers = [_Worker(f"{name}-{k}", self._routes) for k in range(num_workers)]
        self._next = itertools.cycle(self._workers)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def register(self, request_id: str, consumer: OutputConsumer) -> None:
        """Binds a request (before its submission) to the next worker, round robin."""
        self._routes[request_id] = (next(self._next), consumer)

    def is_registered(self, request_id: str) -> bool:
        return request_id in self._routes

    def post(self, batch: StepBatch) -> None:
        """The engine's sink (the model worker; any thread after the engine closed): routes one
        round's events to the workers; never blocks on their work."""
        routes = self._routes
        shares: dict[_Worker, list] = {}
        for event in batch.events:
            route = routes.get(event.request_id)
            if route is not None:
                worker, consumer = route
                share = shares.get(worker)
                if share is None:
                    share = shares[worker] = []
                share.append((consumer, event))
        for worker, share in shares.items():
            worker.put(share)

    def close(self, timeout: float = 10.0) -> None:
        for worker in self._workers:
            worker.stop(timeout)

"""Output workers: routing of per-round batches, per-request order, failure isolation, shutdown."""

from __future__ import annotations

import threading

import pytest

from helios.frontend.output_workers import OutputWorkers
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.outlet import StepBatch

WAIT_S = 30  # a bound on waiting for another thread, never a measurement


class Consumer:
    def __init__(self, gate: threading.Event | None = None, fail_on: int | None = None):
        self.events, self.failures = [], []
        self.finished = threading.Event()
        self.entered = threading.Event()
        self._gate, self._fail_on = gate, fail_on

    def on_event(self, event) -> None:
        self.entered.set()
        if self._gate is not None:
            assert self._gate.wait(WAIT_S)
        if isinstance(event, TokenEvent) and event.token_ids[0] == self._fail_on:
            raise RuntimeError("parser exploded")
        self.events.append(event)
        if isinstance(event, FinishEvent):
            self.finished.set()

    def on_failure(self, error, event) -> None:
        self.failures.append((error, event))
        if isinstance(event, FinishEvent):
            self.finished.set()


def tokens(request_id: str, *ids: int) -> TokenEvent:
    return TokenEvent(request_id, ids, None)


def finish(request_id: str) -> FinishEvent:
    return FinishEvent(request_id, FinishReason.LENGTH, 1, 2, 0)


@pytest.fixture
def workers():
    workers = OutputWorkers(2)
    yield workers
    workers.close()


def test_each_request_gets_its_events_in_order_and_its_route_ends_with_its_finish(workers):
    a, b = Consumer(), Consumer()
    workers.register("a", a)
    workers.register("b", b)
    workers.post(StepBatch((tokens("a", 1), tokens("b", 7), tokens("a", 2))))
    workers.post(StepBatch((tokens("unknown", 3), finish("a"), tokens("b", 8), finish("b"))))
    assert a.finished.wait(WAIT_S) and b.finished.wait(WAIT_S)
    assert a.events == [tokens("a", 1), tokens("a", 2), finish("a")]
    assert b.events == [tokens("b", 7), tokens("b", 8), finish("b")]
    assert not workers.is_registered("a") and not workers.is_registered("b")
    workers.post(StepBatch((tokens("a", 9),)))  # after its end: dropped
    workers.close()
    assert a.events[-1] == finish("a")


def test_a_blocked_request_does_not_hold_a_request_on_another_worker(workers):
    gate = threading.Event()
    slow, quick = Consumer(gate), Consumer()
    workers.register("slow", slow)  # round robin: the two land on different workers
    workers.register("quick", quick)
    workers.post(StepBatch((tokens("slow", 1), tokens("quick", 2), finish("quick"), finish("slow"))))
    assert slow.entered.wait(WAIT_S)
    assert quick.finished.wait(WAIT_S) and not slow.events
    gate.set()
    assert slow.finished.wait(WAIT_S) and len(slow.events) == 2


def test_a_consumer_that_raises_is_told_and_the_others_go_on(workers):
    broken, other = Consumer(fail_on=5), Consumer()
    workers.register("broken", broken)
    workers.register("other", other)
    workers.register("shared", shared := Consumer())  # on the broken one's worker
    workers.post(StepBatch((tokens("broken", 5), tokens("shared", 1), tokens("other", 2))))
    workers.post(StepBatch((finish("broken"), finish("shared"), finish("other"))))
    assert broken.finished.wait(WAIT_S) and other.finished.wait(WAIT_S) and shared.finished.wait(WAIT_S)
    [(error, event)] = broken.failures
    assert isinstance(error, RuntimeError) and str(error) == "parser exploded" and event == tokens("broken", 5)
    assert broken.events == [finish("broken")]  # later events still reach it; it decides what they mean
    assert shared.events == [tokens("shared", 1), finish("shared")]


def test_close_drains_queued_events_first():
    workers = OutputWorkers(1)
    consumer = Consumer()
    workers.register("a", consumer)
    workers.post(StepBatch(tuple(tokens("a", k) for k in range(50)) + (finish("a"),)))
    workers.close()
    assert len(consumer.events) == 51


def test_at_least_one_worker():
    with pytest.raises(ValueError):
        OutputWorkers(0)


def test_events_posted_after_close_are_consumed_by_the_caller():
    workers = OutputWorkers(1)
    workers.close()
    consumer = Consumer()
    workers.register("late", consumer)
    workers.post(StepBatch((finish("late"),)))  # a closed engine answering a late submission
    assert consumer.events == [finish("late")] and not workers.is_registered("late")

"""`EngineLink` at its faults, over a real pipe whose other end the test writes as the engine
process would: a message the serving process cannot read or deliver, and a request id sent twice.
No engine process is spawned (tests/server/test_engine_process.py runs one)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from helios.runtime.engine import EngineRequest
from helios.runtime.engine_link import Admit, Batch, EngineLink, Shutdown, wire_events
from helios.runtime.outlet import StepBatch
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from server.test_engine_process import _ThreadProcess


class _Process:
    """An engine process that runs until it is killed."""

    def __init__(self):
        self.exitcode = None

    def join(self, timeout=None) -> None:
        pass

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        self.exitcode = -9


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture()
def pipe():
    ours, theirs = multiprocessing.Pipe()
    yield ours, theirs
    ours.close()
    theirs.close()


def started_link(connection, sink) -> EngineLink:
    link = EngineLink(connection, _Process())
    link.connect(sink)
    link.start()
    return link


def finishes(batches: list[StepBatch]) -> list[FinishEvent]:
    return [e for b in batches for e in b.events if isinstance(e, FinishEvent)]


def test_a_message_the_serving_process_cannot_unpickle_ends_every_request_and_marks_the_link_unhealthy(pipe):
    """Before: the reader thread ended on the `UnpicklingError` silently: both requests never ended,
    and the link still said it was healthy (so `/health` said 200 and new requests were taken)."""
    ours, theirs = pipe
    batches: list[StepBatch] = []
    link = started_link(ours, batches.append)
    for request_id in ("a", "b"):
        link.submit(EngineRequest(RequestSpec(request_id, (5, 6, 7), 8)))
        assert isinstance(theirs.recv(), Admit)
    theirs.send(Batch(wire_events(StepBatch((TokenEvent("a", (9,), None),))), None))
    theirs.send_bytes(b"not a pickle")
    link._reader.join(10.0)
    assert not link._reader.is_alive()
    ended = finishes(batches)
    assert sorted(e.request_id for e in ended) == ["a", "b"]
    assert all(e.reason is FinishReason.ERROR and "UnpicklingError" in e.message for e in ended)
    assert not link.is_healthy and "UnpicklingError" in link.failure
    assert not link._process.is_alive()  # it serves nobody now: nothing left holds the device
    link.submit(EngineRequest(RequestSpec("late", (5, 6, 7), 8)))  # refused at once, as after a death
    assert finishes(batches)[-1].request_id == "late" and finishes(batches)[-1].reason is FinishReason.ERROR
    link.shutdown(timeout=5.0)


def test_a_sink_that_raises_ends_the_other_requests_with_an_error_and_marks_the_link_unhealthy(pipe):
    ours, theirs = pipe
    batches: list[StepBatch] = []

    def sink(batch: StepBatch) -> None:
        if any(isinstance(e, TokenEvent) for e in batch.events):
            raise RuntimeError("sink broke")
        batches.append(batch)

    link = started_link(ours, sink)
    for request_id in ("a", "b"):
        link.submit(EngineRequest(RequestSpec(request_id, (5, 6, 7), 8)))
        theirs.recv()
    theirs.send(Batch(wire_events(StepBatch((TokenEvent("a", (9,), None),))), None))
    wait_for(lambda: finishes(batches))
    assert sorted((e.request_id, e.reason) for e in finishes(batches)) == [("a", FinishReason.ERROR),
                                                                        ("b", FinishReason.ERROR)]
    assert "sink broke" in finishes(batches)[0].message
    assert not link.is_healthy and "RuntimeError: sink broke" in link.failure
    link.shutdown(timeout=5.0)


def test_the_id_of_a_request_still_outstanding_is_refused_and_free_again_once_it_ended(pipe):
    """Before: the duplicate was sent; the engine rejected it, and its REJECTED end took the running
    request off the link's tracking (a death later left that request without an end) and reached
    the running request's consumer, whose response then failed."""
    ours, theirs = pipe
    batches: list[StepBatch] = []
    link = started_link(ours, batches.append)
    link.submit(EngineRequest(RequestSpec("a", (5, 6, 7), 8)))
    theirs.recv()
    with pytest.raises(ValueError, match="request a: a request of this id is still running"):
        link.submit(EngineRequest(RequestSpec("a", (1, 2), 8)))
    assert not theirs.poll(0.2) and link._outstanding == {"a": 3}  # nothing sent, the running one tracked
    theirs.send(Batch(wire_events(StepBatch((FinishEvent("a", FinishReason.LENGTH, 3, 8, 0),))), None))
    wait_for(lambda: finishes(batches))
    link.submit(EngineRequest(RequestSpec("a", (1, 2), 8)))  # ended: its id may be used again
    assert isinstance(theirs.recv(), Admit)
    theirs.send(Shutdown())  # the engine process's last message
    link.shutdown(timeout=5.0)
    assert [(e.request_id, e.reason) for e in finishes(batches)] == [("a", FinishReason.LENGTH),
                                                                     ("a", FinishReason.CANCELLED)]


def test_a_queued_duplicate_submission_is_refused_without_ending_the_running_request(pipe):
    """A submission written by `QueuedCommands`' sender thread (the pipe holds unread bytes) that
    the link refuses ends its request with ERROR through the sink, by id: for a duplicate id that
    end reached the running request's consumer (and took the route its real end needed)."""
    from helios.runtime.engine_link import DuplicateRequestId
    from helios.server.engine_commands import QueuedCommands

    ours, theirs = pipe
    batches: list[StepBatch] = []
    link = started_link(ours, batches.append)
    commands = QueuedCommands(link, ours)
    commands.submit(EngineRequest(RequestSpec("a", (5, 6, 7), 8)))  # its Admit stays unread
    commands.submit(EngineRequest(RequestSpec("a", (1, 2), 8)))  # queued: the sender thread writes it
    commands.close(timeout=5.0)
    assert commands.num_queued == 0 and not finishes(batches)
    assert isinstance(theirs.recv(), Admit) and not theirs.poll(0.1) and link._outstanding == {"a": 3}
    with pytest.raises(DuplicateRequestId):  # on the caller's thread: raised to it
        link.submit(EngineRequest(RequestSpec("a", (1, 2), 8)))
    theirs.send(Shutdown())
    link.shutdown(timeout=5.0)


def test_a_submission_whose_write_fails_before_the_reader_saw_the_death_ends_with_the_death():
    """The engine process died and the `Admit` written to its pipe fails before the reader thread
    took the pipe's end: the request ended CANCELLED ("the model worker is not running"), so its
    response was a 200 with an empty, cancelled output instead of the death's error."""
    from helios.runtime.engine_link import DIED

    class Broken:
        def send(self, message) -> None:
            raise BrokenPipeError

    process = _Process()
    process.kill()
    link = EngineLink(Broken(), process)  # its reader has not seen the end yet
    batches: list[StepBatch] = []
    link.connect(batches.append)
    link.submit(EngineRequest(RequestSpec("r", (5, 6, 7), 4)))
    assert [(e.request_id, e.reason, e.message) for e in finishes(batches)] == [("r", FinishReason.ERROR, DIED)]


def test_shutdown_closes_the_serving_end_of_the_pipe(pipe):
    """Before: `shutdown` left the serving process's end open, one descriptor leaked for every engine
    process a serving process started and stopped (a test session's servers, a restart in one process)."""
    ours, theirs = pipe
    link = started_link(ours, lambda batch: None)
    theirs.send(Shutdown())  # the engine process's last message
    link.shutdown(timeout=5.0)
    assert ours.closed
    link.cancel("late")  # a command after it is dropped, as after a death
    link.shutdown(timeout=5.0)  # idempotent


class _Engine:
    """The engine `serve_link` serves, as far as it reads it: a request's end goes to the sink at once,
    a finish whose message (a lock) does not pickle for the request named "unpicklable"."""

    def __init__(self):
        from helios.runtime.records.stats import WorkerStats

        self.stats = WorkerStats()
        self.sink = None
        self.is_healthy, self.progress, self.has_pending, self.failure = True, 0, False, None
        self.submitted: list[str] = []

    def connect(self, sink) -> None:
        self.sink = sink

    def start(self) -> None:
        pass

    def refresh_gauges(self) -> None:
        pass

    def submit(self, request: EngineRequest) -> None:
        import threading

        spec = request.spec
        message = threading.Lock() if spec.request_id == "unpicklable" else ""
        self.sink(StepBatch((FinishEvent(spec.request_id, FinishReason.LENGTH, len(spec.prompt_ids), 1, 0, message),)))
        self.submitted.append(spec.request_id)

    def shutdown(self) -> None:
        pass


def test_a_batch_the_engine_process_cannot_pickle_ends_every_request_with_the_reason_and_marks_the_link_unhealthy(
        pipe):
    """Before: the engine process's sender thread died on the `TypeError` (a message it queued: the
    pipe held unread bytes); nothing was sent after it, beats included, so every request hung and
    the sender's queue grew without bound. Now the engine process stops serving as for a failed
    worker (`Died`, naming why), and the link ends the requests with that error."""
    import threading

    from helios.runtime.engine_link import serve_link

    ours, theirs = pipe
    engine = _Engine()
    engine_side = threading.Thread(target=serve_link, args=(theirs, engine, lambda source: None), daemon=True)
    engine_side.start()
    batches: list[StepBatch] = []
    link = EngineLink(ours, _ThreadProcess(engine_side))
    link.connect(batches.append)
    link.submit(EngineRequest(RequestSpec("waiting", (5, 6, 7), 8)))  # ended by the engine: tracked no more
    link.submit(EngineRequest(RequestSpec("unpicklable", (5, 6), 8)))
    link._outstanding["held"] = 4  # a request the engine process still runs
    wait_for(lambda: len(engine.submitted) == 2)  # both ends queued behind the unread beat, then the reader starts
    link.start()
    wait_for(lambda: not link.is_healthy)
    engine_side.join(10.0)
    assert not engine_side.is_alive()
    ended = {e.request_id: e for e in finishes(batches)}
    assert ended["waiting"].reason is FinishReason.LENGTH
    for request_id in ("unpicklable", "held"):
        assert ended[request_id].reason is FinishReason.ERROR and "could not be sent" in ended[request_id].message
    assert "TypeError" in link.failure and "could not be sent" in link.failure
    link.shutdown(timeout=5.0)


class _GaugedEngine(_Engine):
    """An engine whose stats snapshot counts the worker's gauge refreshes (in `generated_tokens`),
    and whose first snapshot on the command loop waits (at most a second) for the worker's."""

    def __init__(self):
        import threading

        super().__init__()
        self.version = 0
        self.loop_took, self.worker_took = threading.Event(), threading.Event()
        self.stats = self

    def refresh_gauges(self) -> None:
        self.version += 1

    def snapshot(self):
        import dataclasses
        import threading

        from helios.runtime.records.stats import WorkerStats

        taken = dataclasses.replace(WorkerStats().snapshot(), generated_tokens=self.version)
        if threading.current_thread().name == "worker":
            self.worker_took.set()
        elif not self.loop_took.is_set():
            self.loop_took.set()
            self.worker_took.wait(1.0)  # the worker's snapshot and message come meanwhile (else after)
        return taken


def test_the_engine_process_never_sends_gauges_older_than_those_it_sent_before(pipe):
    """The command loop's idle stats and the worker's stats sent with a finish were each read, then
    sent, with nothing holding the two together: a snapshot the command loop read before the worker's
    was sent after it, and the serving process kept the older gauges (a finished request still
    active) until they next changed, since the newer ones counted as already sent."""
    import threading

    from helios.runtime.engine_link import serve_link, stats_of

    ours, theirs = pipe
    engine = _GaugedEngine()
    engine_side = threading.Thread(target=serve_link, args=(theirs, engine, lambda source: None), daemon=True)
    engine_side.start()
    assert engine.loop_took.wait(10.0)  # the command loop reads its first idle snapshot
    worker = threading.Thread(name="worker", target=lambda: engine.sink(
        StepBatch((FinishEvent("r", FinishReason.LENGTH, 3, 1, 0),))))
    worker.start()
    worker.join(10.0)
    ours.send(Shutdown())
    received = []
    while True:  # every gauge message, the engine process's last one (its final gauges) included
        assert ours.poll(10.0)
        message = ours.recv()
        if isinstance(message, Shutdown):
            break
        if isinstance(message, Batch) and message.stats is not None:
            received.append(stats_of(message.stats).generated_tokens)
    engine_side.join(10.0)
    assert received == sorted(received) and received[-1] == 1, received


def test_an_admission_that_fails_to_pickle_leaves_no_outstanding_id(pipe, monkeypatch):
    """Before: the id stayed tracked after the Admit raised while pickling (nothing written), so the
    response ended ERROR and then again CANCELLED at shutdown, and the id was refused ever after."""
    ours, theirs = pipe
    batches: list[StepBatch] = []
    link = started_link(ours, batches.append)
    connection_send = ours.send

    def send(message):
        if isinstance(message, Admit) and message.spec.request_id == "bad":
            raise TypeError("cannot pickle 'generator' object")
        connection_send(message)

    monkeypatch.setattr(ours, "send", send)
    with pytest.raises(TypeError):
        link.submit(EngineRequest(RequestSpec("bad", (5, 6, 7), 8)))
    assert link._outstanding == {}
    theirs.send(Shutdown())
    link.shutdown(timeout=5.0)
    assert finishes(batches) == []

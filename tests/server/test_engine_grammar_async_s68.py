"""The engine process's command loop never waits for a grammar compile (`helios.runtime.engine_link.serve_link`,
`helios.server.engine_grammars.EngineGrammars.compile_later`).

Before, the command loop (the engine process's main thread) compiled each admitted grammar and waited for it
(about 1.4 s for a 64 KiB schema of 3,000 required properties on a 2-core machine): every later command, another
client's plain request, a cancellation, the `Shutdown` record, and the heartbeats waited behind it (the model
worker's rounds and their token batches did not: llguidance compiles with the interpreter lock released). The
first three tests run the engine process's main on a thread of this process over a real pipe (the tiny core,
the real grammar compiler) with every compile held by an event until the test releases it, so what they
observe is order, not time; the last ones run `serve_link` against a recording engine and compiles the test
completes by hand. The deep grammar that must compile on the large-stack thread is
tests/server/test_engine_grammars.py's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from concurrent.futures import Future

import pytest
from tokenizers import Tokenizer

from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, GrammarKind, GrammarRequest
from helios.runtime.engine_link import Admit, Batch, Died, Shutdown, batch_of, serve_link, stats_of
from helios.runtime.outlet import Cancel, StopMatched
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.stats import WorkerStats
from helios.server import engine_process
from support.engine_thread import start_engine_main

WAIT_S = 30  # a hang guard: every wait below ends as soon as what it waits for happens
HOLD_S = 3 * WAIT_S  # a held compile's own guard: past any wait of the test's, so what fails is the test's wait
PROMPT = (5, 6, 7)


@pytest.fixture(scope="module")
def grammar_source(tokenizer_json) -> str:
    """A grammar source as the serving process writes it for this core's tokenizer."""
    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    serving = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=(0,))
    return serving.grammar_text(GrammarRequest(GrammarKind.REGEX, "[ab]+"))


class HeldCompiles:
    """Holds every grammar compile (`GrammarCompiler.compile_source`) until `release`; `entered` is set by the
    first compile that began."""

    def __init__(self, monkeypatch):
        self.entered, self.release = threading.Event(), threading.Event()
        compile_source = GrammarCompiler.compile_source

        def held(compiler, source):
            self.entered.set()
            assert self.release.wait(HOLD_S), "the test never released the compile"
            return compile_source(compiler, source)

        monkeypatch.setattr(GrammarCompiler, "compile_source", held)


@contextlib.contextmanager
def engine_main(core, monkeypatch):
    """The engine process's main on a thread of this process; yields (its main thread, the serving side's pipe
    end, the held compiles) once it reported ready. Compiles are released on the way out."""
    held = HeldCompiles(monkeypatch)
    main, ours = start_engine_main(core, monkeypatch)
    try:
        assert ours.poll(WAIT_S) and isinstance(ours.recv(), engine_process._Ready)
        yield main, ours, held
    finally:
        held.release.set()
        with contextlib.suppress(OSError):
            ours.send(Shutdown())
        main.join(WAIT_S)
        ours.close()


class Received:
    """What the serving side read from the pipe, in order: events, the latest stats, whether `Shutdown` came."""

    def __init__(self, connection):
        self._connection = connection
        self.events: list = []
        self.stats = None
        self.has_shut_down = False

    def until(self, is_done) -> None:
        """Reads until `is_done(self)`; fails when that did not happen within the guard (heartbeats keep coming)."""
        deadline = time.monotonic() + WAIT_S
        while not is_done(self):
            assert self._connection.poll(max(0.0, deadline - time.monotonic())), f"not yet; got {self.finishes()}"
            message = self._connection.recv()
            if isinstance(message, Batch):
                if message.stats is not None:
                    self.stats = stats_of(message.stats)
                if message.events is not None:
                    self.events += batch_of(message.events).events
            elif isinstance(message, Shutdown):
                self.has_shut_down = True

    def finishes(self) -> dict[str, FinishEvent]:
        return {e.request_id: e for e in self.events if isinstance(e, FinishEvent)}

    def of(self, request_id: str) -> list:
        return [e for e in self.events if e.request_id == request_id]


def finished(*request_ids: str):
    return lambda received: set(request_ids) <= received.finishes().keys()


def grammar_spec(request_id: str) -> RequestSpec:
    return RequestSpec(request_id, PROMPT, 4, constrained=True)


def test_a_plain_request_behind_a_compiling_grammar_is_answered_before_that_compile_ends(core, grammar_source,
                                                                                          monkeypatch):
    """Before: the plain request's `Admit` waited on the pipe until the grammar's compile ended."""
    with engine_main(core, monkeypatch) as (_, ours, held):
        received = Received(ours)
        ours.send(Admit(grammar_spec("grammar"), grammar_source))
        assert held.entered.wait(WAIT_S)
        ours.send(Admit(RequestSpec("plain", PROMPT, 4), None))
        received.until(finished("plain"))
        assert not held.release.is_set() and received.of("grammar") == []  # still held, nothing of it sent
        assert received.finishes()["plain"].reason is FinishReason.LENGTH
        held.release.set()
        received.until(finished("grammar"))
        grammar_finish = received.finishes()["grammar"]
        assert grammar_finish.reason is not FinishReason.ERROR and grammar_finish.num_output_tokens > 0, grammar_finish


def test_a_cancel_while_its_grammar_compiles_ends_it_at_once_and_it_is_never_submitted(core, grammar_source,
                                                                                        monkeypatch):
    """Before: the `Cancel` waited for the compile, and the request was submitted first."""
    with engine_main(core, monkeypatch) as (main, ours, held):
        received = Received(ours)
        ours.send(Admit(grammar_spec("cancelled"), grammar_source))
        assert held.entered.wait(WAIT_S)
        ours.send(Cancel("cancelled"))
        received.until(finished("cancelled"))
        assert not held.release.is_set()
        assert received.of("cancelled") == [FinishEvent("cancelled", FinishReason.CANCELLED, len(PROMPT), 0, 0, "")]
        held.release.set()
        # one compile thread, in order: this one's compile begins after the cancelled one's compile and its end
        ours.send(Admit(grammar_spec("after"), grammar_source))
        received.until(finished("after"))
        ours.send(Shutdown())
        received.until(lambda r: r.has_shut_down)
        main.join(WAIT_S)
        assert not main.is_alive()
    assert len(received.of("cancelled")) == 1  # nothing more of it: it never reached the engine
    assert received.finishes()["after"].reason is not FinishReason.ERROR
    assert received.stats.requests_admitted == 1  # "after" only


def test_shutdown_while_grammars_compile_ends_them_cancelled_without_waiting_for_the_compile(core, grammar_source,
                                                                                             monkeypatch):
    """One request's compile is held, another's waits behind it; `Shutdown` ends both and the engine process's
    main returns while the compile is still held (before: the `Shutdown` record waited for that compile)."""
    with engine_main(core, monkeypatch) as (main, ours, held):
        received = Received(ours)
        ours.send(Admit(grammar_spec("compiling"), grammar_source))
        assert held.entered.wait(WAIT_S)
        ours.send(Admit(grammar_spec("queued"), grammar_source))
        ours.send(Shutdown())
        received.until(lambda r: r.has_shut_down)
        main.join(WAIT_S)
        assert not main.is_alive() and not held.release.is_set()
        for request_id in ("compiling", "queued"):
            assert received.of(request_id) == [FinishEvent(request_id, FinishReason.CANCELLED, len(PROMPT), 0, 0,
                                                           "the model worker shut down")]
        assert received.stats.requests_admitted == 0


class RecordingEngine:
    """What `serve_link` drives, recording each command it gets, in order."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.changed = threading.Condition()
        self.stats = WorkerStats()
        self.progress = 0
        self.has_pending = False
        self.is_healthy = True

    def connect(self, sink) -> None:
        pass

    def start(self) -> None:
        pass

    def refresh_gauges(self) -> None:
        pass

    def shutdown(self) -> None:
        self._record(("shutdown",))

    def submit(self, request) -> None:
        self._record(("submit", request.spec.request_id, request.grammar))

    def cancel(self, request_id: str) -> None:
        self._record(("cancel", request_id))

    def stop_matched(self, request_id: str, num_output_tokens: int) -> None:
        self._record(("stop_matched", request_id, num_output_tokens))

    def _record(self, call: tuple) -> None:
        with self.changed:
            self.calls.append(call)
            self.changed.notify_all()

    def wait_for(self, num_calls: int) -> list[tuple]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.calls) >= num_calls, WAIT_S), self.calls
            return list(self.calls)


@contextlib.contextmanager
def recording_link():
    """`serve_link` on a thread against a `RecordingEngine`, each compile a future the test ends by hand: yields
    (the serving side's pipe end, the engine, the compiles by source)."""
    engine, compiles = RecordingEngine(), {}

    def compile_later(source: str) -> Future:
        if source == "unstartable":
            raise RuntimeError("the compile thread is gone")
        compiles[source] = Future()
        return compiles[source]

    ours, theirs = multiprocessing.Pipe()
    loop = threading.Thread(target=serve_link, args=(theirs, engine, compile_later))
    loop.start()
    try:
        yield ours, engine, compiles
    finally:
        with contextlib.suppress(OSError):
            ours.send(Shutdown())
        loop.join(WAIT_S)
        ours.close()
    assert not loop.is_alive()


def test_a_held_request_is_submitted_when_its_compile_ends_then_its_own_commands_in_order():
    grammar = object()
    with recording_link() as (ours, engine, compiles):
        ours.send(Admit(grammar_spec("held"), "held grammar"))
        ours.send(StopMatched("held", 2))  # its own command: waits for its submission
        ours.send(Admit(RequestSpec("plain", PROMPT, 4), None))
        ours.send(Cancel("plain"))
        assert engine.wait_for(2) == [("submit", "plain", None), ("cancel", "plain")]
        compiles["held grammar"].set_result(grammar)
        assert engine.wait_for(4)[2:] == [("submit", "held", grammar), ("stop_matched", "held", 2)]
        ours.send(StopMatched("held", 3))  # submitted by now: straight to the engine
        assert engine.wait_for(5)[4] == ("stop_matched", "held", 3)


def test_a_compile_that_fails_or_cannot_start_fails_its_request_alone():
    with recording_link() as (ours, engine, compiles):
        received = Received(ours)
        ours.send(Admit(grammar_spec("bad"), "bad grammar"))
        ours.send(Admit(grammar_spec("unstartable"), "unstartable"))
        ours.send(Admit(RequestSpec("plain", PROMPT, 4), None))
        received.until(finished("unstartable"))
        assert engine.wait_for(1) == [("submit", "plain", None)]
        compiles["bad grammar"].set_exception(GrammarError("the grammar does not compile: nope"))
        received.until(finished("bad"))
        finishes = received.finishes()
        assert finishes["bad"] == FinishEvent("bad", FinishReason.ERROR, len(PROMPT), 0, 0,
                                              "request failed on the model worker: GrammarError: "
                                              "the grammar does not compile: nope")
        assert finishes["unstartable"].reason is FinishReason.ERROR
        assert "RuntimeError: the compile thread is gone" in finishes["unstartable"].message
        ours.send(Cancel("bad"))  # ended already: the engine's to ignore
        assert engine.wait_for(2)[1] == ("cancel", "bad")
    assert ("submit", "bad") not in [call[:2] for call in engine.calls]


def test_a_model_marked_unhealthy_by_its_executor_dies_naming_why():
    """A broken tensor-parallel group marks the model unhealthy without a worker failure: the loop
    ended and the serving process was told only "its loop ended"."""
    engine = RecordingEngine()
    engine.failure, engine.is_healthy, engine.stats.healthy = None, False, False
    ours, theirs = multiprocessing.Pipe()
    loop = threading.Thread(target=serve_link, args=(theirs, engine, lambda source: Future()))
    loop.start()
    loop.join(WAIT_S)
    assert not loop.is_alive()
    messages = []
    while ours.poll(1):
        messages.append(ours.recv())
    (died,) = [m for m in messages if isinstance(m, Died)]
    assert "executor failed" in died.failure and "tensor-parallel" in died.failure


def test_a_compile_dropped_as_the_process_stops_ends_its_request_cancelled():
    """`EngineGrammars.close` cancels the compiles not begun: their requests end CANCELLED, as the
    held ones do (they ended ERROR, "request failed on the model worker: CancelledError")."""
    with recording_link() as (ours, engine, compiles):
        received = Received(ours)
        ours.send(Admit(grammar_spec("dropped"), "dropped grammar"))
        received.until(lambda _: "dropped grammar" in compiles)
        compiles["dropped grammar"].cancel()
        received.until(finished("dropped"))
        assert received.finishes()["dropped"].reason is FinishReason.CANCELLED
    assert ("submit", "dropped") not in [call[:2] for call in engine.calls]

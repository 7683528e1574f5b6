"""The engine in a process of its own, across a message boundary.

The serving process keeps an `EngineLink`: it has the engine's interface for served requests
(`connect`, `start`, `submit`, `cancel`, `stop_matched`, `shutdown`, `is_healthy`, `stats`) and
talks to the engine process over one duplex pipe (`multiprocessing.connection.Connection`) in
plain records: `Admit` (the `RequestSpec` and the source of its grammar, which the engine process
compiles again: a matcher does not cross processes), `Cancel`, `StopMatched` and `Shutdown` one
way; `Batch` (one round's `StepBatch`, and a `StatsSnapshot` when it changed) and `Died` the other.
So the model worker's host work never competes with the HTTP event loop and the output workers for
one interpreter lock.

In the engine process `serve_link` runs the commands on its main thread (the command loop)
against a started `Engine`, and never waits there for a grammar compile: an `Admit` with a grammar
starts its compile on a thread of its own (`compile_grammar`) and is held (`_Compiling`) until it
ends, while later commands (other clients' requests, cancellations) go on; the request is then
submitted, then any `StopMatched` for it that came meanwhile, or it fails alone (ERROR, naming why);
a `Cancel` while it compiles ends it CANCELLED at once, and `Shutdown` ends those still compiling
CANCELLED. Before, the command loop waited for each compile (about 1.4 s for a 64 KiB schema on a
2-core machine) and every request and cancellation behind it waited too (the model worker's rounds
and their token batches did not: llguidance compiles with the interpreter lock released). The
engine's sink writes each round's batch itself while the pipe is drained and idle (a small write
that cannot block), else queues it for a sender thread, which pickles and writes it (the model
worker waits only when `MAX_QUEUED` messages are waiting: back pressure from a serving
process that stopped reading).

What stays true across the boundary: every admitted request ends with exactly one `FinishEvent`.
The link counts the requests it admitted until their finish comes back; if the engine process
dies (or its worker loop fails, or it cannot send one of its messages: it stops serving and says
why; or the link cannot read or deliver one of its messages: a finish may be lost, so the process is
killed), the link reports itself unhealthy and ends each of them with
ERROR ("the model worker died", with their prompt lengths: the tokens generated are counted by
the responses, `helios.server.bridge`), and a later `submit` gets ERROR at once, as the engine does after
its worker failed; `failure` then says why (the worker loop's error, or how the process ended). `shutdown` asks the engine process to stop (requests still running end
CANCELLED, from the engine), waits for the process, and kills it if it does not exit in time. An
engine process whose serving process is gone (end of file on the pipe) shuts down the same way.

Liveness: the engine process's command loop sends a `Beat` every `HEARTBEAT_INTERVAL_S` (one small
message, never on a token's path), so a process that is alive but not serving (stopped by SIGSTOP or
a debugger, its main thread hung) is told from a busy one: once no beat arrived for
`liveness_timeout_s`, `unresponsive_reason` says why (it is None again when the beats resume). The
command loop runs beside the model worker's thread, so a worker stuck inside a round without holding
the interpreter lock (a device sync that never returns, a deadlocked collective, a native call)
would leave the beats flowing: each beat also carries the engine's progress (`Engine.progress`,
rounds completed) and whether requests are pending (`Engine.has_pending`), and once the beats showed
requests pending and the count unchanged for longer than `liveness_timeout_s`, `stalled_reason` says
why (None again at the first beat whose count moved or that shows nothing pending: an idle engine is
never stalled). A round is bounded by what the worker does in it: a prefill is chunked to the
program's extent, a grammar mask is filled within llguidance's step limits, and grammar compiles run
on a thread of their own, off the worker's rounds and off the command loop (a request whose grammar
compiles is not pending in the engine yet, and the beats go on). Nothing is killed for either while
serving. `shutdown` never waits on a pipe the engine process stopped reading: the `Shutdown` record
is written by a thread of its own and waited for at most its deadline (a short one where the engine
process is already unresponsive or stalled: its worker would not finish its round), then the process
is killed, which also frees any writer blocked on the pipe.
"""

from __future__ import annotations

import array
import fcntl
import signal
import termios
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Callable, NamedTuple

from helios.runtime.engine import DuplicateRequestId, Engine, EngineRequest
from helios.runtime.feedback import GrammarState
from helios.runtime.stall_watch import DEFAULT_LIVENESS_TIMEOUT_S, StallWatch
from helios.runtime.outlet import Cancel, EventSink, StepBatch, StopMatched
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.stats import StatsSnapshot, WorkerStats

MAX_QUEUED = 64  # messages the engine process holds for a serving process that reads slowly
STATS_INTERVAL_S = 0.05  # an idle engine process sends changed gauges at most this late
DIED = "the model worker died"
SHUT_DOWN = "the model worker shut down"
DIRECT_EVENTS = 64  # a batch of at most this many events may be written by the thread that sent it
HEARTBEAT_INTERVAL_S = 1.0  # how often the engine process's command loop says it is alive
UNRESPONSIVE_GRACE_S = 2.0  # shutdown's wait for an engine process already unresponsive, before the kill


class Admit(NamedTuple):
    spec: RequestSpec
    grammar_source: str | None  # what the engine process compiles the request's matcher from


class Shutdown(NamedTuple):
    pass


class Batch(NamedTuple):
    events: tuple | None  # one round's events in `wire_events` form; None: only stats
    stats: tuple | None  # `StatsSnapshot` fields in order (mappings as dicts); None: unchanged


def wire_events(batch: StepBatch) -> tuple:
    """The batch's events, token events as plain tuples (pickling a named tuple costs about four
    times as much, and a round holds one token event per running request)."""
    return tuple([tuple(e) if type(e) is TokenEvent else e for e in batch.events])


def batch_of(events: tuple) -> StepBatch:
    new = tuple.__new__
    return StepBatch(tuple([new(TokenEvent, e) if type(e) is tuple else e for e in events]))


class Beat(NamedTuple):
    """The engine process's command loop is alive, and how far its worker got (see the module docstring)."""

    progress: int = 0  # `Engine.progress`: rounds the worker completed
    has_pending: bool = False  # `Engine.has_pending`: a submitted request has not finished


class Died(NamedTuple):
    failure: str  # why the worker loop failed


def stats_fields(snapshot: StatsSnapshot) -> tuple:
    return tuple(dict(v) if isinstance(v, MappingProxyType) else v
                 for v in (getattr(snapshot, f.name) for f in fields(StatsSnapshot)))


def stats_of(values: tuple) -> StatsSnapshot:
    return StatsSnapshot(*(MappingProxyType(v) if isinstance(v, dict) else v for v in values))


class _Stats:
    """What `ServedModel` reads as `engine.stats`: the latest snapshot the engine process sent."""

    def __init__(self):
        self.latest: StatsSnapshot | None = None

    def snapshot(self) -> StatsSnapshot:
        return self.latest if self.latest is not None else WorkerStats().snapshot()


class EngineLink:
    """The serving process's side (see the module docstring). `submit`, `cancel` and
    `stop_matched` are thread-safe; events reach the connected sink from the link's reader thread."""

    def __init__(self, connection, process, stats: StatsSnapshot | None = None,
                 liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S):
        """`connection`: the duplex pipe end; `process`: the engine process (`join`, `kill`,
        `is_alive`), already serving; `liveness_timeout_s`: how long without a `Beat` makes it
        unresponsive."""
        self._connection = connection
        self._process = process
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._outstanding: dict[str, int] = {}  # admitted, finish not yet seen -> prompt tokens
        self._is_closed = False  # shut down or died: submissions end at once
        self._has_died = False
        self._is_stopping = False  # `shutdown` began: its kill is not a death
        self.liveness_timeout_s = liveness_timeout_s
        self._last_beat: float | None = None  # monotonic time of the latest beat (None: not started)
        self._stall_watch = StallWatch(liveness_timeout_s)  # the beats' progress
        self.failure: str | None = None  # why the engine process stopped serving (None: it did not)
        self._reader: threading.Thread | None = None
        self.sink: EventSink | None = None
        self.stats = _Stats()
        self.stats.latest = stats

    def connect(self, sink: EventSink) -> None:
        self.sink = sink

    def start(self) -> None:
        self._last_beat = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="helios-engine-link", daemon=True)
        self._reader.start()

    @property
    def is_healthy(self) -> bool:
        return not self._has_died

    @property
    def unresponsive_reason(self) -> str | None:
        """Why the engine process counts as unresponsive (no beat for `liveness_timeout_s`), or None."""
        last = self._last_beat
        if last is None or self._has_died or self._is_closed:
            return None
        silent_s = time.monotonic() - last
        if silent_s <= self.liveness_timeout_s:
            return None
        return (f"the model worker has not answered for {silent_s:.0f} s (more than {self.liveness_timeout_s:g} s): "
                "its engine process is stopped or hung")

    @property
    def stalled_reason(self) -> str | None:
        """Why the model worker counts as stalled (its beats showed requests pending and no round
        completed for more than `liveness_timeout_s`), or None."""
        if self._has_died or self._is_closed:
            return None
        return self._stall_watch.reason

    @property
    def shows_pending(self) -> bool:
        """Whether the latest beat showed requests pending."""
        return self._stall_watch.shows_pending

    def _beat(self, beat: Beat, now: float) -> None:
        """Takes a beat received at `now` (the reader thread)."""
        self._stall_watch.observe(beat.progress, beat.has_pending, now)
        self._last_beat = now

    def submit(self, request: EngineRequest) -> None:
        """Sends a served request (no `on_event`, no `host_stop`; its grammar, if any, must have a
        `source`) to the engine process; after shutdown or death it ends at once. The id of a
        request still outstanding is refused (`DuplicateRequestId`): the link and the sink's routes know a
        request by its id, so its duplicate's end (REJECTED) would end the running request's
        tracking and reach its consumer."""
        if request.on_event is not None or request.host_stop is not None:
            raise ValueError(f"request {request.spec.request_id}: an engine process serves sink requests only")
        source = None
        if request.grammar is not None:
            source = getattr(request.grammar, "source", None)
            if source is None:
                raise ValueError(f"request {request.spec.request_id}: its grammar has no source to send")
        spec = request.spec
        with self._state_lock:
            is_closed = self._is_closed
            if not is_closed:
                if spec.request_id in self._outstanding:
                    raise DuplicateRequestId(f"request {spec.request_id}: a request of this id is still running")
                self._outstanding[spec.request_id] = len(spec.prompt_ids)
        try:
            if not is_closed and self._send(Admit(spec, source)):
                return
        except BaseException:  # the Admit did not pickle (nothing was written): the request is not outstanding
            with self._state_lock:
                self._outstanding.pop(spec.request_id, None)
            raise
        if not is_closed:
            with self._state_lock:
                # The reader may have ended it already (the pipe broke while this was sent, and the
                # reader's `_end_outstanding` took it): one finish per request.
                if self._outstanding.pop(spec.request_id, None) is None:
                    return
        # A write that failed outside `shutdown` met an engine process that is gone (its reader may
        # not have taken the pipe's end yet): the death's end, not a shutdown's.
        has_died = self._has_died or (not is_closed and not self._is_stopping)
        reason = FinishReason.ERROR if has_died else FinishReason.CANCELLED
        message = DIED if has_died else "the model worker is not running"
        self.sink(StepBatch((FinishEvent(spec.request_id, reason, len(spec.prompt_ids), 0, 0, message),)))

    def cancel(self, request_id: str) -> None:
        self._send(Cancel(request_id))

    def stop_matched(self, request_id: str, num_output_tokens: int) -> None:
        self._send(StopMatched(request_id, num_output_tokens))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stops the engine process after its current round; requests still running end CANCELLED
        (ERROR where it is gone). Blocking, for at most about `timeout` (`UNRESPONSIVE_GRACE_S`
        where the engine process is unresponsive or stalled) plus a few seconds: an engine process that did not
        take the `Shutdown` record or exit by then is killed; then the pipe is closed. Idempotent."""
        if self.unresponsive_reason is not None or self.stalled_reason is not None:
            timeout = min(timeout, UNRESPONSIVE_GRACE_S)
        self._is_stopping = True
        if not self._send_within(Shutdown(), timeout):  # a full pipe it does not read: no waiting on the lock
            self._process.kill()
        if self._reader is not None:
            self._reader.join(timeout)
        self._process.join(timeout if self._reader is None or not self._reader.is_alive() else 1.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5.0)
        self._end_outstanding(FinishReason.CANCELLED, SHUT_DOWN)
        self._close_connection()

    def _close_connection(self) -> None:
        """Closes the serving end of the pipe once nothing reads or writes it (else each engine
        process started and stopped in one serving process leaked a descriptor). Left open where the
        reader still runs or a write still holds the pipe (both end with the process's kill): closing
        under them would hand their next read or write a closed handle. Commands after it are dropped
        (`_send` answers False), as after a death."""
        if self._reader is not None and self._reader.is_alive():
            return
        if not self._send_lock.acquire(timeout=1.0):
            return
        try:
            self._connection.close()
        except OSError:
            pass
        finally:
            self._send_lock.release()

    def _send_within(self, message, timeout: float) -> bool:
        """Sends `message` on a thread of its own; False if that did not end within `timeout` (the
        thread stays blocked until the pipe closes)."""
        writer = threading.Thread(target=self._send, args=(message,), name="helios-engine-shutdown", daemon=True)
        writer.start()
        writer.join(timeout)
        return not writer.is_alive()

    def _send(self, message) -> bool:
        """False when the engine process can no longer be reached."""
        try:
            with self._send_lock:
                self._connection.send(message)
            return True
        except (OSError, ValueError, EOFError):
            return False

    def _read(self) -> None:
        """The reader thread: batches to the sink until the engine process ends."""
        died = None
        try:
            while True:
                message = self._connection.recv()
                if isinstance(message, Batch):
                    self._deliver(message)
                elif isinstance(message, Beat):
                    self._beat(message, time.monotonic())
                elif isinstance(message, Died):
                    died = message.failure
                    break
                else:  # the engine process's end after Shutdown
                    break
        except (EOFError, OSError):
            died = DIED
        except Exception as error:  # noqa: BLE001 - a message it cannot read (unpickling) or deliver (the sink)
            # Nothing after it can be trusted (a finish may be lost): the engine process serves no
            # more, and its requests end here; killed, so it holds no device and `shutdown` never waits on it.
            died = f"the link to the engine process failed: {type(error).__name__}: {error}"
            self._process.kill()
        if died is not None and not self._is_closed and not self._is_stopping:
            self.failure = died if died != DIED else ended_how(self._process)
            self._has_died = True
        if not self._has_died:  # its end after `Shutdown` (or a kill by `shutdown`): a request that crossed it
            self._end_outstanding(FinishReason.CANCELLED, SHUT_DOWN)
        else:
            self._end_outstanding(FinishReason.ERROR, DIED if died == DIED else f"{DIED}: {died}")

    def _deliver(self, message: Batch) -> None:
        if message.stats is not None:
            self.stats.latest = stats_of(message.stats)
        if message.events is None:
            return
        batch = batch_of(message.events)
        finished = [e.request_id for e in batch.events if type(e) is FinishEvent]
        if finished:
            with self._state_lock:
                for request_id in finished:
                    self._outstanding.pop(request_id, None)
        self.sink(batch)

    def _end_outstanding(self, reason: FinishReason, message: str) -> None:
        with self._state_lock:
            self._is_closed = True
            ended, self._outstanding = self._outstanding, {}
        if ended and self.sink is not None:  # the output count is unknown here: 0 (see the module docstring)
            self.sink(StepBatch(tuple(FinishEvent(request_id, reason, num_prompt_tokens, 0, 0, message)
                                      for request_id, num_prompt_tokens in ended.items())))


def ended_how(process) -> str:
    """How the engine process ended, once its pipe closed (it may take a moment to be reaped)."""
    process.join(0.5)
    code = process.exitcode
    if code is None:
        return "its pipe closed"
    if code < 0:
        try:
            return f"the engine process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the engine process was killed by signal {-code}"
    return f"the engine process exited with status {code}"


# -- the engine process's side -------------------------------------------------------------------


class _BatchSender:
    """The engine's sink in the engine process: each round's batch, with the stats when a request
    finished in it (so a response that ended never reads older counters). Messages go out in order.
    While the pipe is drained (the serving process has read everything written: its unread byte
    count is zero) and nothing is queued or being written, `send` writes on the calling thread: a
    small write then cannot block, and a round's tokens leave without waking another thread (at one
    stream that wakeup and its interpreter-lock handoff were on every token's path). Otherwise, and
    for a batch of more than `DIRECT_EVENTS` events, the message is queued for a sender thread,
    which pickles and writes it: a write to a pipe the serving process is behind on can take
    milliseconds, and the model worker must not wait for it before packing its next step."""

    def __init__(self, connection, engine: Engine):
        self._connection = connection
        self._engine = engine
        self._wake = threading.Condition()
        self._queue: list = []
        self._is_writing = False  # a thread is in a write: later messages queue behind it
        self._is_closing = False
        self._is_broken = False  # the serving process is gone: nothing more is sent
        # A message failed to pickle (nothing of it was written, so the pipe is whole): why. Its events
        # (a finish among them, maybe) are lost, so only `Died` is sent after it (`serve_link` stops).
        self.failure: str | None = None
        self.last_stats: tuple | None = None
        self._stats_lock = threading.Lock()  # a snapshot read and sent in one order (`send_changed_stats`)
        self._thread = threading.Thread(target=self._run, name="helios-engine-sender", daemon=True)
        self._thread.start()

    def __call__(self, batch: StepBatch) -> None:
        if any(type(e) is FinishEvent for e in batch.events):
            self._engine.refresh_gauges()  # the gauges the finish changed, before the response ends
            with self._stats_lock:  # see `send_changed_stats`
                self.send(Batch(wire_events(batch), self.changed_stats()))
            return
        self.send(Batch(wire_events(batch), None))

    def send_changed_stats(self) -> None:
        """Sends the gauges if they changed (the command loop, while idle). A snapshot is read and
        its message sent under one lock, here and with a finish: else one read before another could
        be sent after it, and the serving process kept the older gauges until they next changed
        (the newer ones counted as sent)."""
        with self._stats_lock:
            stats = self.changed_stats()
            if stats is not None:
                self.send(Batch(None, stats))

    def changed_stats(self) -> tuple | None:
        values = stats_fields(self._engine.stats.snapshot())
        if values == self.last_stats:
            return None
        self.last_stats = values
        return values

    def send(self, message) -> None:
        """Writes `message` at once when the pipe is drained and idle (see the class docstring),
        else queues it for the sender thread (any thread); waits only while `MAX_QUEUED` messages
        are waiting."""
        with self._wake:
            is_direct = (not self._queue and not self._is_writing and not self._is_broken and not self._is_closing
                         and _is_small(message) and unread_bytes(self._connection) == 0)
            if is_direct:
                self._is_writing = True
            else:
                while len(self._queue) >= MAX_QUEUED and not self._is_broken and self._thread.is_alive():
                    self._wake.wait(0.1)
                self._queue.append(message)
                self._wake.notify_all()
                return
        try:
            self._write([message])
        finally:
            with self._wake:
                self._is_writing = False
                if self._queue:
                    self._wake.notify_all()  # what queued behind this write

    def close(self, timeout: float = 30.0) -> None:
        """Sends what is queued, then stops the sender thread."""
        with self._wake:
            self._is_closing = True
            self._wake.notify_all()
        self._thread.join(timeout)

    def _write(self, messages: list) -> None:
        for message in messages:
            if self._is_broken or (self.failure is not None and type(message) is not Died):
                return
            try:
                self._connection.send(message)  # pickled whole before any byte is written
            except OSError:
                self._is_broken = True
            except Exception as error:  # noqa: BLE001 - a message that does not pickle: see `failure`
                self.failure = f"a message to the serving process could not be sent: {type(error).__name__}: {error}"

    def _run(self) -> None:
        while True:
            with self._wake:
                while (not self._queue or self._is_writing) and not (self._is_closing and not self._queue):
                    self._wake.wait()
                if not self._queue:
                    return
                messages, self._queue = self._queue, []
                self._is_writing = True
                self._wake.notify_all()  # a sink waiting for room
            try:
                self._write(messages)
            finally:
                with self._wake:
                    self._is_writing = False


def _is_small(message) -> bool:
    """Whether `message` pickles far below a pipe's buffer (so writing it to a drained pipe cannot
    block)."""
    return type(message) is not Batch or message.events is None or len(message.events) <= DIRECT_EVENTS


def unread_bytes(connection) -> int | None:
    """Bytes written to `connection`'s socket that its peer has not read yet (Linux: SIOCOUTQ);
    None where that cannot be told (another platform or kind of connection)."""
    try:
        count = array.array("i", [0])
        fcntl.ioctl(connection.fileno(), termios.TIOCOUTQ, count, True)
        return count[0]
    except (AttributeError, OSError, ValueError):
        return None


@dataclass
class _Held:
    """An admitted request whose grammar is compiling, and its `StopMatched` commands that came meanwhile."""

    spec: RequestSpec
    commands: list[StopMatched] = field(default_factory=list)


class _Compiling:
    """The admitted requests whose grammar is still compiling, held off the engine so that the command
    loop never waits for a compile. A request is submitted when its compile ends (on the compile's
    thread), then its commands that came meanwhile, in order; a compile that fails ends its request
    alone with ERROR naming why; a `Cancel` while it compiles ends it CANCELLED at once (its compile's
    result is dropped). Every decision about a held request (submitted, failed, cancelled, closed)
    is taken under one lock, so a command is applied either to the held request or, after its
    submission, by the engine, never both and never before its `Admit`; once `close` ran nothing more
    is submitted or sent for a held request. Owned by `serve_link`: `admit`, `command` and `close` from
    its command loop (`admit` never after `close`)."""

    def __init__(self, engine: Engine, sender: _BatchSender):
        self._engine = engine
        self._sender = sender
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}

    def admit(self, spec: RequestSpec, compiling: Future[GrammarState]) -> None:
        """Holds `spec` until `compiling` ends (at once if it already has)."""
        with self._lock:
            self._held[spec.request_id] = _Held(spec)
        compiling.add_done_callback(lambda done: self._compiled(spec.request_id, done))

    def command(self, message: Cancel | StopMatched) -> bool:
        """Takes `message` if its request is held (True); False: the engine's to apply."""
        with self._lock:
            held = self._held.get(message.request_id)
            if held is None:
                return False
            if isinstance(message, StopMatched):
                held.commands.append(message)
                return True
            del self._held[message.request_id]
            self._end(held.spec, FinishReason.CANCELLED, "")
        return True

    def close(self, reason: FinishReason, message: str) -> None:
        """Ends every held request with `reason`; compiles that end later are dropped."""
        with self._lock:
            ended, self._held = self._held, {}
            for held in ended.values():
                self._end(held.spec, reason, message)

    def _compiled(self, request_id: str, done: Future[GrammarState]) -> None:
        """A compile ended (the compile's thread; the command loop's where it had ended before `admit`)."""
        with self._lock:
            held = self._held.pop(request_id, None)
            if held is None:  # cancelled, or the loop ended (`close`), while it compiled
                return
            if done.cancelled():  # the compiles dropped as the process stops (`EngineGrammars.close`)
                self._end(held.spec, FinishReason.CANCELLED, "the model worker shut down")
                return
            try:
                grammar = done.result()
            except Exception as error:  # noqa: BLE001 - this request fails alone
                self._end(held.spec, FinishReason.ERROR,
                          f"request failed on the model worker: {type(error).__name__}: {error}")
                return
            self._engine.submit(EngineRequest(held.spec, grammar=grammar))
            for command in held.commands:
                self._engine.stop_matched(command.request_id, command.num_output_tokens)

    def _end(self, spec: RequestSpec, reason: FinishReason, message: str) -> None:
        self._sender.send(Batch((FinishEvent(spec.request_id, reason, len(spec.prompt_ids), 0, 0, message),), None))


def serve_link(connection, engine: Engine, compile_grammar: Callable[[str], Future[GrammarState]]) -> None:
    """The engine process's main loop: applies the serving process's commands to `engine` (built,
    not started) until `Shutdown` or the end of the pipe, then shuts the engine down. A worker loop
    that fails, or a message that could not be sent (`_BatchSender.failure`), is reported as `Died`.
    `compile_grammar(source)` starts compiling an admitted request's matcher and returns at once
    (`helios.server.engine_grammars.EngineGrammars.compile_later`): the request is held meanwhile
    (`_Compiling`), and the loop goes on with other commands."""
    sender = _BatchSender(connection, engine)
    engine.connect(sender)
    engine.start()
    compiling = _Compiling(engine, sender)
    next_beat = 0.0
    try:
        while engine.is_healthy and sender.failure is None:
            now = time.monotonic()
            if now >= next_beat:  # from this loop: a loop stopped or stuck sends none
                sender.send(Beat(engine.progress, engine.has_pending))
                next_beat = now + HEARTBEAT_INTERVAL_S
            if not connection.poll(STATS_INTERVAL_S):
                sender.send_changed_stats()
                continue
            message = connection.recv()
            if isinstance(message, Shutdown):
                break
            _apply(engine, compiling, message, compile_grammar)
        else:
            reason = sender.failure or _death_reason(engine)
            compiling.close(FinishReason.ERROR, f"model worker failed: {reason}")
            engine.shutdown()
            sender.send(Died(reason))
            sender.close()
            return
    except (EOFError, OSError):
        pass  # the serving process is gone
    compiling.close(FinishReason.CANCELLED, "the model worker shut down")
    engine.shutdown()
    sender.send(Batch(None, stats_fields(engine.stats.snapshot())))
    sender.send(Shutdown())
    sender.close()


def _death_reason(engine: Engine) -> str:
    """Why the command loop stopped serving `engine`: its worker loop's failure, or the executor that
    marked it unhealthy (a tensor-parallel group that broke: its cause is in this process's log)."""
    if engine.failure:
        return engine.failure
    if not engine.stats.healthy:
        return "the model stopped serving: its executor failed (a tensor-parallel rank failed; the log says why)"
    return "its loop ended"


def _apply(engine: Engine, compiling: _Compiling, message,
           compile_grammar: Callable[[str], Future[GrammarState]]) -> None:
    if isinstance(message, Admit):
        if message.grammar_source is None:
            engine.submit(EngineRequest(message.spec))
            return
        try:
            compiled = compile_grammar(message.grammar_source)
        except Exception as error:  # noqa: BLE001 - a compile that could not start: this request fails alone
            compiled = Future()
            compiled.set_exception(error)
        compiling.admit(message.spec, compiled)
    elif isinstance(message, (Cancel, StopMatched)) and not compiling.command(message):
        if isinstance(message, Cancel):
            engine.cancel(message.request_id)
        else:
            engine.stop_matched(message.request_id, message.num_output_tokens)


def wait_ready(connection, timeout: float, is_alive: Callable[[], bool]):
    """The engine process's first message (its ready record or its startup error), or None when it
    ended without one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if connection.poll(0.2):
            try:
                return connection.recv()
            except (EOFError, OSError):
                return None
        if not is_alive():
            return None
    return None

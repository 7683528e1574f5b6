"""The in-process engine: one model worker thread that owns the device, scheduler and executor.

Other threads talk to it only through `submit`, `cancel` and `stop_matched`, which enqueue plain
records and wake the worker. The worker loop: take new requests (scheduler admission; a rejection becomes that
request's REJECTED event and touches nothing else), apply cancellations, build a plan, compute the
grammar masks of constrained rows, run it, validate and complete it, then deliver events. Per-token
host work that must finish before the next round runs here (`helios.runtime.feedback`): the worker
owns constrained requests' grammar matchers and advances them, and runs runtime host stops, so the
scheduler sees them before it plans the lane again.

Output work is not done here. A request submitted without `on_event` (the server's) has its events
go out with every other such event of the round as one `StepBatch` record (`helios.runtime.outlet`)
to the connected sink (`connect`: the server's output workers) at the end of the round, and the
frontend answers with commands: `cancel`, and `stop_matched` when it finds a stop string (the
request ends STOP with the frontend's token count; tokens generated past the stop are dropped by the
frontend and not counted in `generated_tokens`, which counts such a request's tokens when it ends).
A request with `on_event` (in-process callers: offline generation, benchmarks, tests) gets its
events through it in the worker thread as they happen.

Two execution frames: with an executor whose `launch` returns before the device finishes (CUDA),
the worker keeps up to two plans submitted. After launching a plan it asks the scheduler for
another; the scheduler offers a second frame only when it needs no feedback from the first (a
decode round of the same cohort, fed by device-owned pending tokens, see `helios.runtime.scheduling.steps`),
and the worker packs and launches it before it waits for the first one's completion. Completions
are taken oldest first. The engine drives every executor through one protocol
(`helios.runtime.execution.protocol.PlanExecutor`: `launch` then `finish`); with one frame it launches a plan
`alone` and finishes it before scheduling the next.

Request state: the engine keeps only each request's hooks (`EngineRequest`); what a request asks
for is its `RequestSpec`, which the scheduler owns and each plan carries once to the executor's
packer (`StepPlan.admitted`), with the ids it may drop (`StepPlan.finished`).

Every request ends with exactly one `FinishEvent`. `on_event` and the sink must not block (hand off
to a queue). That holds at the edges
too: `shutdown` ends queued and running requests CANCELLED, a request submitted after shutdown ends
CANCELLED at once, and if the worker loop itself fails every request it knows ends ERROR and the
engine reports itself unhealthy (`is_healthy`, `stats.healthy`).

One request can never kill the worker: an unexpected exception raised by what belongs to one request
(its admission checks, its grammar, its host stop, its `on_event`) ends that request with ERROR and
the worker keeps serving; a failed launch or completion ends that plan's requests with ERROR. Only
a failure of the worker's own bookkeeping (the scheduler) ends the loop. A grammar that meets a
dead end or one of llguidance's limits is no failure of the worker: the request ends GRAMMAR_DEAD_END
or GRAMMAR_LIMIT with the tokens its grammar took (`helios.runtime.feedback`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from helios.errors import AdmissionRejected, ExecutionError
from helios.runtime.execution.prompt_scores import prompt_score_events
from helios.runtime.execution.protocol import PlanExecutor
from helios.runtime.feedback import Advance, GrammarState, LaneFeedback, grammar_limit_message
from helios.runtime.outlet import Cancel, Command, EventSink, Outbox, StepBatch, StopMatched
from helios.runtime.records.capacities import Operation
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.records.stats import WorkerStats
from helios.runtime.records.events import (FinishEvent, FinishReason, PromptScoresEvent, RequestEvent, TokenEvent,
                                          rejected)


__all__ = ["DuplicateRequestId", "Engine", "EngineRequest", "EngineStateError", "GrammarState"]


class DuplicateRequestId(ValueError):
    """`submit` of a sink request (`Engine`, `helios.runtime.engine_link.EngineLink`) whose id is
    that of a sink request still outstanding: the sink's consumers know a request by its id, so the
    duplicate's end (REJECTED) would reach the running request's consumer and end its response."""


class EngineStateError(ExecutionError):
    """The engine cannot do what was asked in the state it is in: `start` of an engine already
    started or shut down (an engine is started at most once; a shut-down engine serves no more), or
    `run_until_idle` of a started one (its worker owns the scheduler)."""


@dataclass(frozen=True)
class EngineRequest:
    """A prepared request and its hooks. `host_stop(token_id) -> bool` (None when the request has
    no runtime host stops) runs in the worker after each token and returns True when a stop matched.
    `on_event` receives the request's events when the engine has no sink (None: only with one)."""

    spec: RequestSpec
    on_event: Callable[[RequestEvent], None] | None = None
    grammar: GrammarState | None = None
    host_stop: Callable[[int], bool] | None = None


class Engine:
    """Owns the worker thread; `submit`/`cancel` are thread-safe."""

    def __init__(self, scheduler: Scheduler, executor: PlanExecutor, stats: WorkerStats | None = None,
                 clock: Callable[[], int] = time.monotonic_ns, frames: int | None = None,
                 sink: EventSink | None = None):
        """`frames`: plans kept submitted at once (1 or 2); None: 2 when the executor overlaps.
        `sink`: where each round's `StepBatch` goes (see `connect`)."""
        self.scheduler = scheduler
        self.executor = executor
        self.frames = frames if frames is not None else (2 if executor.overlaps else 1)
        if self.frames not in (1, 2):
            raise ValueError(f"{self.frames} execution frames (1 or 2)")
        self._launched: deque = deque()  # (plan, the executor's handle), oldest first
        self.stats = stats or WorkerStats()
        self.outbox = Outbox(self.stats, sink)
        self._clock = clock
        self._wake = threading.Condition()
        self._ingress: deque[EngineRequest] = deque()
        self._commands: deque[Command] = deque()
        self._active: dict[str, EngineRequest] = {}
        self._running = False
        self._is_closed = False  # shut down or failed: `submit` answers at once
        self._thread: threading.Thread | None = None
        self.failure: str | None = None  # why the worker loop failed (None: it did not)
        self._rounds = 0  # rounds completed (`progress`)
        self.feedback = LaneFeedback(executor.model.prepared.contract.model.vocabulary.mask_words)
        self.stats.request_slots = scheduler.caps.max_active
        self.refresh_gauges()  # every page free from the start, not from the first round on

    def connect(self, sink: EventSink) -> None:
        """Sends the events of requests submitted without `on_event` to `sink`, one `StepBatch`
        per round. The sink is called from the worker thread (and from `submit` after shutdown) and
        must not block."""
        self.outbox.sink = sink

    def start(self) -> None:
        """Starts the worker thread, once. A second worker would drive the same scheduler beside
        the first (and outlive `shutdown`, which stops one), and one started after `shutdown` would
        serve an engine whose requests all ended and whose submissions end at once."""
        if self._is_closed:
            raise EngineStateError(f"the engine was shut down{'' if self.stats.healthy else ' (its worker failed)'}: "
                                   "it cannot be started again (build another)")
        if self._thread is not None:
            raise EngineStateError("the engine was started already")
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="helios-model-worker", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stops the worker after its current round: queued and running requests end CANCELLED, and
        a request submitted later ends CANCELLED at once (idempotent). An engine never started
        (driven by `run_until_idle`, maybe interrupted mid-round) winds down here, in the calling
        thread, as the worker's last round would: nothing else would ever end its requests."""
        with self._wake:
            self._running = False
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        elif not self._is_closed:
            try:
                self._wind_down()
            except BaseException as error:  # noqa: BLE001 - as `_loop`: no request waits on a broken engine
                self._fail_worker(error)
                raise

    @property
    def is_healthy(self) -> bool:
        """False once the worker loop failed (a started worker that is no longer alive)."""
        if not self.stats.healthy:
            return False
        return self._thread is None or self._thread.is_alive() or self._is_closed

    @property
    def progress(self) -> int:
        """Rounds the worker completed (`step` calls returned): grows while it serves; a worker
        stuck inside a round (a device sync, a collective, a native call) leaves it still."""
        return self._rounds

    @property
    def has_pending(self) -> bool:
        """Whether a submitted request has not finished yet (waiting for admission or admitted)."""
        return bool(self._ingress) or bool(self._active)

    def submit(self, request: EngineRequest) -> None:
        """Queues `request` for admission (any thread); its events go to its `on_event`, or to the
        connected sink when it has none. A sink request whose id is that of one still outstanding
        (submitted, its end not yet handed to the outbox) is refused (`DuplicateRequestId`); a
        duplicate with its own `on_event` ends REJECTED there, touching nothing else."""
        if request.on_event is None and self.outbox.sink is None:
            raise ValueError(f"request {request.spec.request_id} has no on_event and the engine no sink")
        with self._wake:
            if not self._is_closed:
                if request.on_event is None:
                    request_id = request.spec.request_id
                    if request_id in self.outbox.outstanding:
                        raise DuplicateRequestId(f"request {request_id}: a request of this id is still running")
                    self.outbox.outstanding.add(request_id)
                self._ingress.append(request)
                self._wake.notify()
                return
        reason = FinishReason.ERROR if not self.stats.healthy else FinishReason.CANCELLED
        event = _ended(request, reason, "the model worker is not running")
        if request.on_event is None:
            self.outbox.sink(StepBatch((event,)))
        else:
            request.on_event(event)

    def cancel(self, request_id: str) -> None:
        self._command(Cancel(request_id))

    def stop_matched(self, request_id: str, num_output_tokens: int) -> None:
        """The frontend found a stop in the request's output after `num_output_tokens` tokens: the
        request ends STOP (nothing happens when it already ended). Any thread."""
        self._command(StopMatched(request_id, num_output_tokens))

    def _command(self, command: Command) -> None:
        with self._wake:
            # Closed: every request has ended and no worker would take it (a server whose worker
            # failed goes on refusing requests, and may cancel each one it refused).
            if self._is_closed:
                return
            self._commands.append(command)
            self._wake.notify()

    # -- worker --------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # noqa: BLE001 - no request may wait forever on a dead worker
            self._fail_worker(error)
            raise

    def _fail_worker(self, error: BaseException) -> None:
        """The worker's own bookkeeping failed: the engine is unhealthy and every request ends ERROR."""
        self.failure = f"{type(error).__name__}: {error}"
        self.stats.healthy = False
        self._close(FinishReason.ERROR, f"model worker failed: {type(error).__name__}: {error}")

    def _serve(self) -> None:
        while True:
            with self._wake:
                while self._running and not (self._ingress or self._commands or self.scheduler.has_work):
                    self._wake.wait()
                if not self._running:
                    break
                ingress, self._ingress = list(self._ingress), deque()
                commands, self._commands = list(self._commands), deque()
            self._admit(ingress)
            self._apply(commands)
            self.step()
        self._wind_down()

    def _wind_down(self) -> None:
        """The last round: completes the launched plans, cancels every request and closes. A plan
        an interrupt took from `_launched` before its completion stays in the scheduler's flight;
        its requests end CANCELLED all the same (their pages wait for a completion that never comes:
        the engine serves no more)."""
        self._drain()
        for request_id in list(self._active):
            self._dispatch(self.scheduler.cancel(request_id))
        self.outbox.flush()
        self._close(FinishReason.CANCELLED, "the model worker shut down")

    def _close(self, reason: FinishReason, message: str) -> None:
        """Refuses later submissions and ends every request still known with `reason`, counted as
        finished (as a request cancelled in the ingress channel is), its hooks dropped."""
        with self._wake:
            self._is_closed = True
            pending, self._ingress = list(self._ingress), deque()
        pending += list(self._active.values())
        self._active.clear()
        self.outbox.close()
        for request in pending:
            self.feedback.forget(request.spec.request_id)
            self.stats.requests_finished[reason.name.lower()] += 1
            self.outbox.end(request.on_event, _ended(request, reason, message))
        try:
            self.outbox.flush()
        except Exception:  # noqa: BLE001 - nobody is left to tell
            pass

    def run_until_idle(self, max_stalled_steps: int = 10_000) -> None:
        """Synchronous driving (tests, offline generation): admit, step until nothing is left.

        However many rounds the work takes, it runs to its end (an offline batch of a million rounds
        is no hang); `ExecutionError` only after `max_stalled_steps` steps in a row launched and
        completed nothing while work remained (nothing else moves a synchronous engine on).

        An engine shut down (or failed) has ended every request it knew, and ends later ones at
        once: it returns at once (a plan an interrupt left in the scheduler's flight is work no
        step would ever complete). A started engine's worker owns its scheduler: `EngineStateError`."""
        if self._is_closed:
            return
        if self._thread is not None:
            raise EngineStateError("run_until_idle drives an engine never started (its worker serves this one)")
        stalled = 0
        while stalled < max_stalled_steps:
            if self._ingress:
                ingress, self._ingress = list(self._ingress), deque()
                self._admit(ingress)
            if self._commands:
                commands, self._commands = list(self._commands), deque()
                self._apply(commands)
            else:
                self.outbox.flush()  # what `_apply` ends with
            if not self.scheduler.has_work and not self._ingress:  # a cancellation may have emptied the
                self.outbox.flush()  # scheduler's queue while requests still wait in the ingress channel
                if not self._commands:  # one the last events' hooks sent (a second stop_matched) is applied
                    return  # now: left queued, the next run would apply it to a new request of that id
                continue
            stalled = 0 if self.step() else stalled + 1
        raise ExecutionError(f"the engine did not go idle: {max_stalled_steps} steps in a row ran no plan")

    def _apply(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, StopMatched):
                self._stop_matched(command)
            else:
                self._cancel(command.request_id)
        self.outbox.flush()

    def _stop_matched(self, command: StopMatched) -> None:
        """Ends the request STOP with the frontend's output count (tokens past the stop are dropped)."""
        if command.request_id not in self._active:
            return  # already ended (its end may have crossed the command)
        events = [e._replace(num_output_tokens=min(e.num_output_tokens, command.num_output_tokens))
                  if isinstance(e, FinishEvent) and e.request_id == command.request_id else e
                  for e in self.scheduler.stop(command.request_id)]
        self._dispatch(events)

    def _admit(self, requests: list[EngineRequest]) -> None:
        """Submits ingress to the scheduler while its pending deque has room; the rest stays in the
        ingress channel, in order, until a round frees room (a request whose predecessor just
        finished is not rejected only because the scheduler has not yet promoted the next one)."""
        for index, request in enumerate(requests):
            if len(self.scheduler.queues.waiting) >= self.scheduler.caps.queue_capacity:
                with self._wake:
                    self._ingress.extendleft(reversed(requests[index:]))
                return
            self._admit_one(request)

    def _admit_one(self, request: EngineRequest) -> None:
        spec = request.spec
        try:
            self.scheduler.submit(spec)
        except AdmissionRejected as error:
            self.stats.requests_rejected += 1
            self.outbox.end_unadmitted(request.on_event, rejected(spec.request_id, len(spec.prompt_ids), str(error)))
            return
        except Exception as error:  # noqa: BLE001 - a malformed request fails alone (nothing was queued)
            self.stats.requests_finished["error"] += 1
            self.outbox.end_unadmitted(request.on_event, _ended(request, FinishReason.ERROR, _request_failure(error)))
            return
        self._active[spec.request_id] = request
        self.feedback.register(spec.request_id, request.grammar, request.host_stop)
        self.outbox.admit(spec.request_id, request.on_event, spec.has_host_stops)
        self.stats.requests_admitted += 1
        self.stats.prompt_tokens += len(spec.prompt_ids)

    def _cancel(self, request_id: str) -> None:
        """Cancels a scheduled request, or one still waiting in the ingress channel."""
        with self._wake:
            waiting = [r for r in self._ingress if r.spec.request_id == request_id]
            for request in waiting:
                self._ingress.remove(request)
        for request in waiting:  # never admitted, counted as finished (as a request failing admission is)
            self.stats.requests_finished["cancelled"] += 1
            self.outbox.end_unadmitted(request.on_event, _ended(request, FinishReason.CANCELLED, ""))
        self._dispatch(self.scheduler.cancel(request_id))

    def step(self) -> bool:
        """Submits plans until `frames` are in flight (or none can run now), then completes the oldest;
        whether it launched or completed a plan."""
        ran = False
        while len(self._launched) < self.frames:
            plan = self.scheduler.schedule()
            if plan is None:
                break
            self._launch(plan)
            ran = True
        if self._launched:
            self._complete_oldest()
            ran = True
        self.outbox.flush()  # the frontend works on this round's output while the worker packs the next
        self.refresh_gauges()  # admissions and cancellations change them without a plan too
        self._rounds += 1
        return ran

    def _launch(self, plan) -> None:
        """Launches `plan` (with one frame `alone`: finished before the next launch) after adding
        its grammar masks; a failure fails the plan at once. A request whose grammar met a dead
        end or a limit at its mask, or raised there, ends then (GRAMMAR_DEAD_END, `_end_at_limit`,
        ERROR): its row runs, its token is dropped."""
        try:
            plan = plan.with_masks(self.feedback.fill_masks(plan.rows))
            dead_ends, limits, failures = self.feedback.dead_ends, self.feedback.limits, self.feedback.failures
            launched = self.executor.launch(plan, alone=self.frames == 1)
        except Exception as error:  # noqa: BLE001 - failed like a failed completion
            self._fail(plan, error)
            return
        if self._launched:
            self.stats.second_frames += 1
        self._launched.append((plan, launched))
        for request_id in dead_ends:
            self._dispatch(self.scheduler.dead_end(request_id))
        for request_id, reason in limits.items():
            request = self._active.get(request_id)
            if request is not None:
                self._end_at_limit(request, reason)
        for request_id, error in failures.items():
            request = self._active.get(request_id)
            if request is not None:
                self._fail_request(request, error)

    def _fail(self, plan, error: Exception) -> None:
        message = str(error) if isinstance(error, ExecutionError) else f"execution failed: {type(error).__name__}: {error}"
        self._dispatch(self.scheduler.fail(plan, message))

    def _drain(self) -> None:
        """Completes every launched plan (shutdown: nothing stays submitted on the device)."""
        while self._launched:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        """Waits for the oldest launched plan and completes (or fails) it."""
        plan, launched = self._launched.popleft()
        try:
            output = self.executor.finish(launched)
            scores = []  # read before the next launch; only a scored prefill has them
            if plan.operation == Operation.SCORED_PREFILL:  # (outputs a fault left unreadable fail the plan too)
                scores = prompt_score_events(plan, output.outputs, self._prompt_lens(plan))
        except Exception as error:  # noqa: BLE001 - a device or program failure must not kill the worker
            self._fail(plan, error)
            return
        if plan.variant is not None:
            self.stats.graph_launches[plan.operation.name.lower()] += 1
        for name, count in output.state_launches.items():  # the core's SNAPSHOT / RESTORATION programs
            self.stats.graph_launches[name] += count
        self._dispatch(scores + self.scheduler.complete(plan, output.results))

    def _prompt_lens(self, plan) -> dict[str, int]:
        """Prompt lengths of the plan's requests that asked for prompt scores."""
        active = (self._active.get(row.request_id) for row in plan.rows)
        return {r.spec.request_id: len(r.spec.prompt_ids) for r in active if r is not None and r.spec.score_prompt}

    def _dispatch(self, events: list[RequestEvent]) -> None:
        # Hooks register at admission only (never while events are dispatched): without any, no
        # token is fed to a grammar or a host stop.
        watching = self.feedback.watching
        active, outbox = self._active, self.outbox
        for event in events:
            request = active.get(event.request_id)
            if request is None:
                continue
            if event.__class__ is TokenEvent and not watching:  # the usual event: counted and delivered
                try:
                    outbox.deliver_tokens(request.on_event, event)
                except Exception as error:  # noqa: BLE001 - as below
                    self._fail_request(request, error, events)
                continue
            if isinstance(event, FinishEvent):
                self._finish(request, event)
                continue
            if isinstance(event, PromptScoresEvent):
                try:
                    self.outbox.deliver(request.on_event, event)
                except Exception as error:  # noqa: BLE001
                    self._fail_request(request, error, events)
                continue
            try:  # the grammar takes the ids before they are delivered: one it refuses never is
                fed = self.feedback.advance(event.request_id, event.token_ids) if watching else None
                if fed is not None and fed.failure:
                    self._deliver_then_end_at_limit(request, event, fed, events)
                    continue
                outbox.count(event)
                outbox.deliver(request.on_event, event)
                if fed is not None and fed.is_stopped:
                    self._dispatch(self.scheduler.stop(event.request_id))
            except Exception as error:  # noqa: BLE001 - this request's hooks failed: it ends, the worker serves on
                self._fail_request(request, error, events)

    def _deliver_then_end_at_limit(self, request: EngineRequest, event: TokenEvent, fed: Advance,
                                   round_events) -> None:
        """Delivers the ids of `event` the grammar took (`fed.num_taken`), then ends the request at
        the limit its grammar met on the next one (`_end_at_limit`, the rest dropped uncounted)."""
        if fed.num_taken:
            taken = event._replace(token_ids=event.token_ids[:fed.num_taken],
                                   logprobs=None if event.logprobs is None else event.logprobs[:fed.num_taken])
            self.outbox.count(taken)
            self.outbox.deliver(request.on_event, taken)
        self._end_at_limit(request, fed.failure, len(event.token_ids) - fed.num_taken, round_events)

    def _end_at_limit(self, request: EngineRequest, reason: str, num_dropped: int = 0, round_events=()) -> None:
        """Ends a request whose grammar met a limit (`helios.runtime.feedback`; `reason`: llguidance's
        error, bounded): GRAMMAR_LIMIT with the output its grammar took, or ERROR naming the limit
        when it took none; the scheduler frees what it holds. `num_dropped`: output tokens the
        scheduler counted past those (the refused one and any after it), never delivered.
        `round_events` as in `_fail_request`."""
        request_id = request.spec.request_id
        events = self.scheduler.cancel(request_id)
        ended = [e for e in events if isinstance(e, FinishEvent) and e.request_id == request_id]
        if not ended:
            ended = [e for e in round_events if isinstance(e, FinishEvent) and e.request_id == request_id]
        self._dispatch([e for e in events if e not in ended])
        if request_id not in self._active:
            return
        finish = ended[0] if ended else _ended(request, FinishReason.ERROR, "")
        num_output_tokens = max(finish.num_output_tokens - num_dropped, 0)
        if num_output_tokens:
            finish = finish._replace(reason=FinishReason.GRAMMAR_LIMIT, num_output_tokens=num_output_tokens,
                                     message=reason)
        else:
            finish = finish._replace(reason=FinishReason.ERROR, num_output_tokens=0,
                                     message=grammar_limit_message(reason))
        self._finish(request, finish)

    def _fail_request(self, request: EngineRequest, error: Exception, round_events=()) -> None:
        """Ends one request with ERROR after its own hook raised; the scheduler frees what it holds.
        `round_events`: the events being dispatched, which hold its finish where the scheduler had
        already ended it this round (its counts are then that finish's)."""
        request_id = request.spec.request_id
        message = _request_failure(error)
        events = self.scheduler.cancel(request_id)
        ended = [e for e in events if isinstance(e, FinishEvent) and e.request_id == request_id]
        if not ended:
            ended = [e for e in round_events if isinstance(e, FinishEvent) and e.request_id == request_id]
        others = [e for e in events if e not in ended]
        self._dispatch(others)
        if request_id in self._active:
            finish = ended[0] if ended else _ended(request, FinishReason.ERROR, message)
            self._finish(request, FinishEvent(request_id, FinishReason.ERROR, finish.num_prompt_tokens,
                                              finish.num_output_tokens, finish.num_reused_tokens, message))

    def _finish(self, request: EngineRequest, event: FinishEvent) -> None:
        del self._active[event.request_id]
        self.feedback.forget(event.request_id)
        self.stats.requests_finished[event.reason.name.lower()] += 1
        self.outbox.end(request.on_event, event)

    def refresh_gauges(self) -> None:
        """Reads the scheduler's gauges into `stats` (the model worker thread; once from the
        constructor, before it starts). Queued requests include those still in the ingress channel
        (beyond the scheduler's queue capacity)."""
        c = self.scheduler.counters()
        stats = self.stats
        with stats._lock:
            stats.active_requests, stats.queued_requests = c.num_running, c.num_waiting + len(self._ingress)
            stats.pages_total, stats.pages_free, stats.pages_cached = c.pages_total, c.pages_free, c.pages_cached
            stats.window_pages_total, stats.window_pages_free = c.window_pages_total, c.window_pages_free
            stats.window_pages_cached = c.window_pages_cached
            stats.prefix_lookup_tokens, stats.prefix_reused_tokens = c.prefix_lookup_tokens, c.prefix_reused_tokens
            stats.snapshots_published, stats.snapshots_evicted = c.snapshots_published, c.snapshots_evicted
            stats.snapshots_restored = c.snapshots_restored
            stats.mixed_grammar_decode_steps = c.mixed_grammar_decode_plans
            stats.constrained_max_inflight = c.constrained_max_inflight
            images = self.executor.images
            if images is not None:
                stats.image_cache_hits, stats.image_cache_misses = images.cache.stats.hits, images.cache.stats.misses


def _request_failure(error: Exception) -> str:
    if isinstance(error, ExecutionError):  # typed failures are worded for the client already
        return str(error)
    return f"request failed on the model worker: {type(error).__name__}: {error}"


def _ended(request: EngineRequest, reason: FinishReason, message: str) -> FinishEvent:
    """The terminal event of a request the worker can no longer run."""
    return FinishEvent(request.spec.request_id, reason, len(request.spec.prompt_ids), 0, 0, message)

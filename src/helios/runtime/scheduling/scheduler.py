"""The scheduler: admission, steps, completion and cancellation for one model worker.

CPU-only policy; it never touches tensors. One thread (the model worker) calls every method.
Protocol per step: `plan = schedule()`; the executor performs `plan.copies`, then runs
`plan.variant` over `plan.rows`; then `complete(plan, results)` (or `fail(plan, message)` if the
execution itself failed), in submission order. At most two plans are in flight: the second only
as a decode round fed by device-owned pending tokens (see `steps`).

Ownership: the scheduler owns every `RequestState`, the page pool, snapshots and slots.
Outward it returns immutable plans, events and `RequestView`s. A plan is self-contained (see
`helios.runtime.records.plan`): it carries each request's `RequestSpec` the first time a row names it
and the ids of requests released since the previous plan, so the packers (and tensor-parallel
peers) hold no per-request state that did not come from the plans.

Termination: every submitted request gets exactly one `FinishEvent` (EOS, LENGTH, STOP,
CANCELLED or ERROR; REJECTED is raised by `submit` instead). A finished request's slot and pages
are released when the last plan naming it completes (the final fence); cancellation, host stops
and failures never publish a checkpoint of it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from operator import attrgetter
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from helios.runtime.scheduling.admission import DuplicateRequest, QueueFull, check_admission
from helios.runtime.cache.cache_manager import CacheManager, CopyWork, Fence
from helios.runtime.records.capacities import Capacities, Operation
from helios.runtime.scheduling.completion import check_completion
from helios.runtime.records.events import FinishEvent, FinishReason, RequestEvent, TokenEvent
from helios.runtime.records.faults import UnknownPlan
from helios.runtime.scheduling.invariants import check_state
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.cache.pages import PageAllocator
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.cache.prefix_cache import PrefixCache, root_digest
from helios.runtime.scheduling.queues import RequestQueues
from helios.runtime.records.request import RequestSpec, RequestState, RequestStatus, RequestView
from helios.runtime.scheduling.slots import SlotTable
from helios.runtime.cache.snapshots import Residence, SnapshotStore
from helios.runtime.scheduling.steps import Draft, StepBuilder

_CONSTRAINED = attrgetter("constrained")
_LOG = logging.getLogger(__name__)


@dataclass
class Flight:
    """A plan in flight and what its completion settles."""

    plan: StepPlan
    requests: list[RequestState]
    fences: list[Fence]


class SchedulerCounters(NamedTuple):
    """Lifetime counters and current gauges for metrics (no request identities)."""

    num_waiting: int
    num_running: int
    num_inflight_plans: int
    pages_total: int
    pages_free: int
    pages_cached: int
    pages_evicted: int
    prefix_lookup_tokens: int
    prefix_reused_tokens: int
    preemptions: int
    snapshots_published: int
    snapshots_evicted: int
    snapshots_offloaded: int
    mixed_grammar_decode_plans: int
    constrained_max_inflight: int
    snapshots_restored: int = 0
    # The window region's own pages (layouts with one, `helios.runtime.cache.window_pages`; else 0).
    window_pages_total: int = 0
    window_pages_free: int = 0
    window_pages_cached: int = 0


def _warn_offload_without_room(caps: Capacities, policy: SchedulerPolicy) -> None:
    """OFFLOAD preemption that can never checkpoint a victim recomputes every one, as RECOMPUTE would:
    said once at startup (it still serves), with the setting that lacks room. A victim's state needs
    host slots, and on a core whose state only its SNAPSHOT program writes (state outside the pages)
    a continuation row to stage it through (`helios.runtime.cache.snapshots`)."""
    if policy.preemption != PreemptionMode.OFFLOAD:
        return
    geometry, layout = caps.cache, caps.cache.layout
    if not geometry.num_host_slots:
        _LOG.warning("preemption offload with no host pages: every preempted request is recomputed "
                     "(give --host-pages N)")
    elif layout.window_region:  # (`CacheManager.checkpoint`: a snapshot would lack the window's own pages)
        _LOG.warning("preemption offload on a core with a window region of its own page ids, which takes no "
                     "checkpoints: every preempted request is recomputed")
    elif layout.restores_through_programs and not layout.pages_capture_state and not geometry.num_continuation_rows:
        _LOG.warning("preemption offload on a core whose state goes to the host through its SNAPSHOT program and "
                     "a continuation row, with a snapshot capacity of 0: every preempted request is recomputed "
                     "(serve with --snapshot-capacity N, or prepare the core with a snapshot capacity)")


def _settle_finished(req: RequestState, result: RowResult) -> None:
    """A row of a request that already finished completed: a second frame's decode round, planned
    before the first round's EOS was known, fed that EOS token and advanced the slot's state (and
    pages) by its position. Its history now ends there, so `num_computed_tokens` follows, and a
    final snapshot (`Scheduler._release`) captures state and endpoint together; left behind, a
    recurrent state one token past the endpoint would be published and restored by later turns.
    A row past the known tokens (a cancelled or stopped request, never checkpointed) is ignored."""
    if req.num_computed_tokens < result.consumed_endpoint <= len(req.token_ids):
        req.num_computed_tokens = result.consumed_endpoint


class Scheduler:
    def __init__(self, caps: Capacities, policy: SchedulerPolicy, cache: CacheManager,
                 slots: SlotTable, clock: Callable[[], int]):
        self.caps = caps
        self.policy = policy
        self.cache = cache
        self.slots = slots
        self.queues = RequestQueues()
        self.builder = StepBuilder(caps, policy, cache, slots, self.queues)
        self._clock = clock
        self._inflight: deque[Flight] = deque()
        self._pending = CopyWork()
        self._next_arrival = 0
        self._next_sequence = 0
        self._released_ids: list[str] = []  # announced requests released since the last plan
        self._mixed_grammar_decode_plans = 0
        self._constrained_max_inflight = 0
        # Plain decode completions applied in one lean pass (`_complete_plain`); False: row by row.
        self.plain_completion = True

    @classmethod
    def create(cls, caps: Capacities, policy: SchedulerPolicy = SchedulerPolicy(),
               clock: Callable[[], int] = time.monotonic_ns) -> Scheduler:
        """Wire the pool, prefix cache and snapshot store for `caps`."""
        geometry = caps.cache
        pool = PagePool(PageAllocator(geometry.num_pages), PrefixCache())
        snapshots = SnapshotStore(pool, geometry.layout, geometry.num_continuation_rows,
                                  geometry.num_host_slots)
        window = PagePool(PageAllocator(geometry.num_window_pages), PrefixCache()) if geometry.num_window_pages else None
        cache = CacheManager(pool, snapshots, geometry.layout, policy.prefix_caching, window)
        _warn_offload_without_room(caps, policy)
        return cls(caps, policy, cache, SlotTable(caps.max_active), clock)

    # -- requests ------------------------------------------------------------------------------

    def submit(self, spec: RequestSpec) -> None:
        """Queue a prepared request, or raise an `AdmissionRejected` subclass (nothing changes)."""
        check_admission(spec, self.caps)
        if spec.request_id in self.queues.requests:
            raise DuplicateRequest(f"request {spec.request_id} is already active")
        if len(self.queues.waiting) >= self.caps.queue_capacity:
            raise QueueFull(f"the admission queue holds {self.caps.queue_capacity} requests")
        self._next_arrival += 1
        root = root_digest(self.caps.cache.identity, spec.cache_salt)
        req = RequestState(spec, self._next_arrival, root, list(spec.prompt_ids))
        self.cache.group_key(req)  # before it queues: the queue counts waiting requests by group
        self.queues.add(req)

    def cancel(self, request_id: str) -> list[RequestEvent]:
        """End a request with CANCELLED at any point; [] when it already ended or is unknown."""
        return self._terminate(request_id, FinishReason.CANCELLED)

    def stop(self, request_id: str) -> list[RequestEvent]:
        """A host stop matched: end with STOP, discard its unpublished state; [] if already ended."""
        return self._terminate(request_id, FinishReason.STOP)

    def dead_end(self, request_id: str) -> list[RequestEvent]:
        """Its grammar allows no token after its output, which is incomplete: end with
        GRAMMAR_DEAD_END (the output so far, nothing published); [] if already ended. A row of a
        launched plan then completes without a token for it."""
        return self._terminate(request_id, FinishReason.GRAMMAR_DEAD_END)

    def view(self, request_id: str) -> RequestView | None:
        req = self.queues.requests.get(request_id)
        return None if req is None else req.view()

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    @property
    def has_work(self) -> bool:
        """Something is queued, running, in flight, or waiting to be copied."""
        return bool(self.queues.requests or self._inflight or self._pending.copies)

    # -- steps ---------------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """The next plan to submit, or None when nothing can run until a completion arrives."""
        if self._inflight:  # admission work the launched plan does not need, done while it runs
            self.cache.complete_chains()
        if len(self._inflight) >= 2:
            return None
        if self._inflight:
            head = self._inflight[0]
            draft = self.builder.build_second(head.plan.operation, head.plan.variant, head.requests,
                                              bool(head.plan.copies or self._pending.copies))
        else:
            pending, self._pending = self._pending, CopyWork()
            draft = self.builder.build(pending)
        return None if draft is None else self._launch(draft)

    def _launch(self, draft: Draft) -> StepPlan:
        sequence = self._next_sequence
        self._next_sequence += 1
        admitted = []
        for req in draft.requests:  # (announcing and counting touch separate fields: one pass)
            req.num_inflight_plans += 1
            if not req.announced:
                req.announced = True
                admitted.append(req.spec)
        finished, self._released_ids = tuple(self._released_ids), []
        plan = StepPlan(sequence, sequence % 2, draft.operation, draft.variant, tuple(draft.rows),
                        tuple(draft.copies), draft.num_tokens, tuple(admitted), finished)
        self._inflight.append(Flight(plan, draft.requests, draft.fences))
        constrained = sum(map(_CONSTRAINED, plan.rows))
        if constrained:
            self._constrained_max_inflight = max(self._constrained_max_inflight, len(self._inflight))
        if self.cache.groups.held:  # its admissions may have taken a group's last waiting member
            self.cache.drop_holds(self.queues.num_awaiting.__contains__)
        return plan

    def complete(self, plan: StepPlan, results: Sequence[RowResult]) -> list[RequestEvent]:
        """Validate and apply the completion of the oldest plan in flight; returns its events."""
        flight, in_order = self._take_flight(plan)
        if not in_order:
            return self._abort(flight, f"plan {plan.sequence} completed out of submission order")
        constrained = sum(map(_CONSTRAINED, plan.rows))
        if plan.operation == Operation.DECODE and 0 < constrained < len(plan.rows):
            self._mixed_grammar_decode_plans += 1  # counted once the plan ran (a failed launch never does)
        violation, plain = check_completion(plan, results, self.caps.vocab_size)
        if violation is not None:
            return self._abort(flight, violation)
        events: list[RequestEvent] = []
        if plain and self.plain_completion:
            settled = self._complete_plain(plan.rows, results, flight.requests, events)
        else:
            settled = self._complete_rows(plan.rows, results, flight.requests, events)
        for snapshot_id, kind in flight.fences:
            self.cache.snapshots.settle(snapshot_id, kind, True)
        if not settled:
            self._release_done(flight.requests)
        return events

    def _complete_rows(self, rows: Sequence[PlanRow], results: Sequence[RowResult], requests: list[RequestState],
                       events: list[RequestEvent]) -> bool:
        """Applies validated results row by row (any plan); False: `_release_done` must follow."""
        now = None
        for row, result, req in zip(rows, results, requests):
            self._retire_row(row, req)
            if req.status != RequestStatus.RUNNING:
                if req.status == RequestStatus.FINISHED:
                    _settle_finished(req, result)
                continue
            req.num_computed_tokens = result.consumed_endpoint
            reason = None
            if row.samples:
                if req.spec.observe and now is None:
                    now = self._clock()
                reason = self._accept(req, result, now if req.spec.observe else None, events)
            self.cache.publish(req)
            self.cache.release_outside_window(req)
            if reason is not None:
                self._finish(req, reason, events)
        return False

    def _complete_plain(self, rows: Sequence[PlanRow], results: Sequence[RowResult], requests: list[RequestState],
                        events: list[RequestEvent]) -> bool:
        """`_complete_rows` for validated plain decode rows (one position, one sampled token each,
        `check_completion`): the same updates, events and releases in the same order, with
        `_retire_row` and `_accept` inlined and the cache's commit work called only for lanes where
        it can change anything (`CacheManager.commit_work`). True when every request was running:
        `_release_done` then has nothing to release (a request that finished here was released by
        `_finish` if it can be, and no plan names a request twice)."""
        publish_every, trims = self.cache.commit_work()
        cache, running, finished = self.cache, RequestStatus.RUNNING, RequestStatus.FINISHED
        eos, length = FinishReason.EOS, FinishReason.LENGTH
        now, settled, new = None, True, tuple.__new__
        for result, req in zip(results, requests):
            req.num_inflight_plans -= 1
            req.num_inflight_tokens -= 1
            req.num_pending_samples -= 1
            if req.status is not running:
                settled = False
                if req.status is finished:
                    _settle_finished(req, result)
                continue
            req.num_computed_tokens = computed = result.consumed_endpoint
            spec, token_ids = req.spec, result.token_ids
            observed = None
            if spec.observe:
                if now is None:
                    now = self._clock()
                observed = now
            history = req.token_ids
            token = token_ids[0]
            history.append(token)
            events.append(new(TokenEvent, (req.request_id, token_ids, observed, result.logprobs)))  # TokenEvent(...)
            reason = eos if token in spec.eos_ids else (
                length if len(history) - req.num_prompt_tokens >= spec.max_output_tokens else None)
            if publish_every and min(computed, len(history)) // publish_every > req.num_published_pages:
                cache.publish(req)
            if trims:
                cache.release_outside_window(req)
            if reason is not None:
                self._finish(req, reason, events)
        return settled

    def fail(self, plan: StepPlan, message: str) -> list[RequestEvent]:
        """The execution of `plan` failed: its lanes end with ERROR, its copies publish nothing.
        Its finished ids go out again with the next plan (it may never have reached the packers)."""
        flight, _ = self._take_flight(plan)
        for request_id in plan.finished:
            current = self.queues.requests.get(request_id)
            if current is None or not current.announced:  # not admitted again since
                self._released_ids.append(request_id)
        return self._abort(flight, message)

    # -- internals -----------------------------------------------------------------------------

    def _take_flight(self, plan: StepPlan) -> tuple[Flight, bool]:
        for index, flight in enumerate(self._inflight):
            if flight.plan.sequence == plan.sequence:
                del self._inflight[index]
                return flight, index == 0
        raise UnknownPlan(f"plan {plan.sequence} is not in flight")

    def _abort(self, flight: Flight, message: str) -> list[RequestEvent]:
        events: list[RequestEvent] = []
        for row, req in zip(flight.plan.rows, flight.requests):
            self._retire_row(row, req)
            if req.status != RequestStatus.FINISHED:
                self._finish(req, FinishReason.ERROR, events, message)
        for snapshot_id, kind in flight.fences:
            self.cache.snapshots.settle(snapshot_id, kind, False)
        self._release_done(flight.requests, intact=False)  # the failed plan may have run in part
        return events

    @staticmethod
    def _retire_row(row: PlanRow, req: RequestState) -> None:
        req.num_inflight_plans -= 1
        req.num_inflight_tokens -= row.query_len
        req.num_pending_samples -= row.samples

    @staticmethod
    def _accept(req: RequestState, result: RowResult, observed: int | None,
                events: list[RequestEvent]) -> FinishReason | None:
        """Append emitted tokens up to the first EOS or the output limit; the reason it ends."""
        token_ids, logprobs = result.token_ids, result.logprobs
        if len(token_ids) == 1:  # the common case, kept cheap
            token = token_ids[0]
            req.token_ids.append(token)
            events.append(TokenEvent(req.request_id, token_ids, observed, logprobs))
            if token in req.spec.eos_ids:
                return FinishReason.EOS
            if len(req.token_ids) - req.num_prompt_tokens >= req.spec.max_output_tokens:
                return FinishReason.LENGTH
            return None
        reason = None
        count = 0
        for token in token_ids:
            req.token_ids.append(token)
            count += 1
            if token in req.spec.eos_ids:
                reason = FinishReason.EOS
            elif req.num_output_tokens >= req.spec.max_output_tokens:
                reason = FinishReason.LENGTH
            if reason is not None:
                break
        events.append(TokenEvent(req.request_id, tuple(token_ids[:count]), observed,
                                 logprobs[:count] if logprobs is not None else None))
        return reason

    def _terminate(self, request_id: str, reason: FinishReason) -> list[RequestEvent]:
        req = self.queues.requests.get(request_id)
        if req is None or req.status == RequestStatus.FINISHED:
            return []
        events: list[RequestEvent] = []
        self._finish(req, reason, events)
        if self.cache.groups.held:  # a group's last waiting member may have left
            self.cache.drop_holds(self.queues.num_awaiting.__contains__)
        return events

    def _finish(self, req: RequestState, reason: FinishReason, events: list[RequestEvent],
                message: str = "") -> None:
        self.queues.leave(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        events.append(FinishEvent(req.request_id, reason, req.num_prompt_tokens, req.num_output_tokens,
                                  max(req.num_reused_tokens, 0), message))
        if req.num_inflight_plans == 0:
            self._release(req)

    def _release_done(self, requests: list[RequestState], intact: bool = True) -> None:
        for req in requests:
            if req.status == RequestStatus.FINISHED and req.num_inflight_plans == 0 and not req.released:
                self._release(req, intact)

    def _release(self, req: RequestState, intact: bool = True) -> None:
        """The final fence passed: return the slot and pages (checkpointing a successful end). With
        members of its prompt group still waiting, the cache holds the prompt for them first
        (`CacheManager.hold_prompt`), unless it ended in a failure. `intact` False: the last plan
        naming it failed (its copies may not have run, its program may have run in part, past the
        request's end), so nothing of it is held or checkpointed."""
        if req.slot >= 0:
            if (intact and req.finish_reason != FinishReason.ERROR
                    and self.queues.num_awaiting.get(req.prompt_key)):
                self.cache.hold_prompt(req)
            natural = intact and req.finish_reason in (FinishReason.EOS, FinishReason.LENGTH)
            if natural and req.spec.publish_snapshot and self.policy.prefix_caching:
                work = self.cache.checkpoint(req, Residence.DEVICE)
                if work is not None:
                    self._pending = CopyWork(self._pending.copies + work.copies,
                                             self._pending.fences + work.fences)
            self.cache.release(req)
            self.slots.release(req.slot)
            req.slot = -1
        if req.snapshot_id:
            self.cache.snapshots.discard(req.snapshot_id)
            req.snapshot_id = 0
        self.queues.forget(req)
        req.released = True
        if req.announced:  # the next plan tells the packers to drop it
            self._released_ids.append(req.request_id)

    # -- observation ---------------------------------------------------------------------------

    def counters(self) -> SchedulerCounters:
        pool, snapshots = self.cache.pool, self.cache.snapshots
        return SchedulerCounters(
            len(self.queues.waiting), len(self.queues.running), len(self._inflight), pool.num_pages,
            pool.allocator.num_free, pool.cache.num_cached, pool.num_evicted,
            self.cache.num_lookup_tokens, self.cache.num_reused_tokens, self.builder.num_preemptions,
            snapshots.num_published, snapshots.num_evicted, snapshots.num_offloaded,
            self._mixed_grammar_decode_plans, self._constrained_max_inflight, snapshots.num_restored,
            *self._window_counters())

    def _window_counters(self) -> tuple[int, int, int]:
        if self.cache.window is None:
            return 0, 0, 0
        window = self.cache.window.pool
        return window.num_pages, window.allocator.num_free, window.cache.num_cached

    def check_invariants(self) -> None:
        """Raise `InvariantViolation` if any bookkeeping contradicts itself (tests run it per step)."""
        check_state(self.caps, self.cache, self.slots, self.queues,
                    [(flight.plan, flight.requests) for flight in self._inflight])

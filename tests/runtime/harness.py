"""Capacities builders and a driver that runs a scheduler against the fake executor.

The driver executes each plan as soon as it is scheduled (device order) and completes plans in
submission order only when the scheduler offers nothing more, so two frames really overlap. It
checks the scheduler's invariants after every call and that every request ends exactly once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from helios.runtime.records.capacities import (CacheGeometry, Capacities, HistoryKind, HistoryRegion, LengthSource,
                                       Operation, ProgramVariant, StorageLayout)
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.plan import StepPlan
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import VOCAB, FakeExecutor


def variants(max_active: int = 8, prefill_tokens: int = 64, mixed: bool = True,
             speculative: tuple[int, int] | None = None, length_source=LengthSource.QUERY_LENGTH,
             draft_lag: int | None = None, resume: bool = False) -> tuple[ProgramVariant, ...]:
    """Decode at 1, 4 and max_active rows; prefill (and mixed, and resume) at two token extents."""
    out = [ProgramVariant(f"decode{b}", Operation.DECODE, b, b) for b in sorted({1, 4, max_active})]
    for tokens in sorted({16, prefill_tokens}):
        out.append(ProgramVariant(f"prefill{tokens}", Operation.PREFILL, max_active, max(tokens, max_active)))
        if mixed:
            out.append(ProgramVariant(f"mixed{tokens}", Operation.MIXED, max_active, max(tokens, max_active)))
        if resume:
            out.append(ProgramVariant(f"resume{tokens}", Operation.RESUME, max_active, max(tokens, max_active)))
    out.append(ProgramVariant("scored", Operation.SCORED_PREFILL, max_active, max(prefill_tokens, max_active)))
    if speculative is not None:
        draft, width = speculative
        out.append(ProgramVariant("spec", Operation.SPECULATIVE, max_active, max_active * width, draft, width,
                                  length_source, True, draft_lag))
    return tuple(out)


def capacities(max_active: int = 8, num_pages: int = 64, page_tokens: int = 4, context: int = 256,
               prefill_tokens: int = 64, rows: int = 8, host_slots: int = 64, queue: int = 1024,
               stateful: bool = False, window: int = 0, logit_bias_width: int = 4, eos_width: int = 0,
               programs: bool = False, **variant_options) -> Capacities:
    """`window` > 0: the paged region is a sliding window of that many tokens. `programs`: the core
    has state programs (SNAPSHOT and RESTORATION: `StorageLayout.restores_through_programs`)."""
    regions = (HistoryRegion("kv", HistoryKind.PAGED_KV),)
    if window:
        regions = (HistoryRegion("kv", HistoryKind.SLIDING_WINDOW, window_tokens=window),)
    if stateful:
        regions += (HistoryRegion("ssm", HistoryKind.RECURRENT),)
    layout = StorageLayout(page_tokens, regions, restores_through_programs=programs)
    max_pages = min(num_pages, -(-context // page_tokens))
    geometry = CacheGeometry(layout, num_pages, max_pages, rows, host_slots, b"test-model")
    return Capacities(max_active, context, prefill_tokens, VOCAB,
                      variants(max_active, prefill_tokens, **variant_options), geometry,
                      queue_capacity=queue, logit_bias_width=logit_bias_width, eos_width=eos_width)


def spec(request_id: str, prompt, max_output: int = 8, **options) -> RequestSpec:
    return RequestSpec(request_id, tuple(prompt), max_output, **options)


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish: FinishEvent | None = None
    num_finishes: int = 0
    token_events: list[TokenEvent] = field(default_factory=list)


class Driver:
    """Runs `scheduler` against `executor`; `on_events` may cancel or stop requests."""

    def __init__(self, scheduler: Scheduler, executor: FakeExecutor, check: bool = True):
        self.scheduler = scheduler
        self.executor = executor
        self.check = check
        self.outcomes: dict[str, Outcome] = {}
        self.plans: list[StepPlan] = []
        self.max_inflight = 0
        self.inflight: deque = deque()
        self.fail_next: Callable[[StepPlan], bool] | None = None

    def submit(self, *specs: RequestSpec) -> None:
        for item in specs:
            self.scheduler.submit(item)
            self.outcomes.setdefault(item.request_id, Outcome())
        self._check()

    def record(self, events) -> None:
        for event in events:
            outcome = self.outcomes[event.request_id]
            assert outcome.finish is None, f"{event.request_id}: event after its terminal event"
            if isinstance(event, TokenEvent):
                outcome.tokens.extend(event.token_ids)
                outcome.token_events.append(event)
            else:
                outcome.finish = event
                outcome.num_finishes += 1

    def cancel(self, request_id: str) -> None:
        self.record(self.scheduler.cancel(request_id))
        self._check()

    def stop(self, request_id: str) -> None:
        self.record(self.scheduler.stop(request_id))
        self._check()

    def step(self, on_events: Callable[[list], None] | None = None) -> bool:
        """Schedule what can be scheduled, else complete the oldest plan. False when idle."""
        plan = self.scheduler.schedule()
        self._check()
        if plan is not None:
            self.plans.append(plan)
            self.inflight.append((plan, self.executor.run(plan)))
            self.max_inflight = max(self.max_inflight, len(self.inflight))
            return True
        if not self.inflight:
            return False
        plan, results = self.inflight.popleft()
        if self.fail_next is not None and self.fail_next(plan):
            events = self.scheduler.fail(plan, "injected failure")
        else:
            events = self.scheduler.complete(plan, results)
        self._check()
        self.record(events)
        if on_events is not None:
            on_events(events)
        return True

    def run(self, on_events=None, max_steps: int = 100_000) -> dict[str, Outcome]:
        for _ in range(max_steps):
            if not self.step(on_events):
                break
        else:
            raise AssertionError("the scheduler did not drain")
        assert not self.scheduler.has_work, "idle with work left: the scheduler stalled"
        return self.outcomes

    def _check(self) -> None:
        if self.check:
            self.scheduler.check_invariants()


def make(policy: SchedulerPolicy = SchedulerPolicy(), stateful: bool = False, window: int = 0, **caps_options):
    caps = capacities(stateful=stateful, window=window, **caps_options)
    scheduler = Scheduler.create(caps, policy, clock=iter(range(10**9)).__next__)
    return scheduler, Driver(scheduler, FakeExecutor(caps, stateful=stateful, window=window))


def assert_all_released(scheduler: Scheduler) -> None:
    """Every page free or cached (parked, or held only by published snapshots); every slot free."""
    pool = scheduler.cache.pool
    snapshot_pages = set(scheduler.cache.snapshots.page_holders())
    for page in range(pool.num_pages):
        if pool.allocator.is_free(page) or pool.cache.is_parked(page):
            continue
        assert page in snapshot_pages, f"page {page} still held by a request"
    assert scheduler.slots.num_free == scheduler.slots.num_slots
    assert not scheduler.queues.requests


EOS = FinishReason.EOS
LENGTH = FinishReason.LENGTH

"""A seeded, model-based stress of the real engine: random arrivals, cancellations, stops, faults.

`StressRun(scenario, recipe).run()` drives an unstarted `Engine` over eager programs of a tiny
random checkpoint (`stress_model`: the programs and history regions `helios prepare` would declare,
token-logprobs twins, scored prefill and SPECULATIVE variants included, called eagerly as in
tests/speculative/support.py) with `submit`, `cancel`, `stop_matched` and `run_until_idle` only,
from the calling thread (`run_threaded`: on its worker thread, shut down midway):

- requests arrive in bursts when the engine went idle, and at random points while it runs (at a
  plan's launch and at token events); prompts share prefixes (prefix cache), some arrive as a group
  with one prompt (the `n` choices of one request: prompt sharing; seeded choices when sampled);
  output limits down to one; some ask for log-probabilities or prompt scores, carry a logit bias
  (their steps run plain programs, the others speculate) or a grammar (`AllowAll`: the constrained
  path, the same output); some take the id of a request that ended (a duplicate is rejected);
- EOS ids and stop token sequences (a runtime host stop) are drawn from the request's output
  alone, so they end it at a known token; a frontend stop (`stop_matched`) is sent after some
  token; some requests' `on_event` raises at a token (the request must end ERROR, alone); some plans
  fail before their launch, after their program ran or at their finish (their requests end ERROR);
- cancellations aim at a phase: still in the ingress channel (the scheduler's queue is full),
  waiting (queued or preempted), in a prompt chunk, in a plain decode round, in a speculative
  round, after some tokens; an already finished request is cancelled now and then;
- the page pool is small enough that requests are preempted (recompute or offload).

The model: each request's output alone on a fresh plain engine (`run_alone`), cut at its EOS id or
stop sequence, is what it must deliver when it ends by itself; a cancelled, stopped or failed
request delivers a prefix of it. `check` asserts that, exactly one finish per request with the
right reason and counts, log-probabilities and prompt scores as asked, the worker's counters, and
that the idle engine holds nothing: every slot free, every page free or cached, no snapshot owned
by a request, no prompt group member, no packer, feedback or outbox record left.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, NamedTuple

import torch

from helios.contract import StartupOptions, resolve_settings
from helios.contract.views import TOKEN_LOGPROB_OUTPUTS
from helios.errors import ExecutionError
from helios.ignition.export import CapacityPlan, history_window
from helios.ignition.preparation.contract import ProgramResource, declare_paged_text
from helios.ignition.program_spec import DRAFT_PREFIX, ProgramOptions, program_spec
from helios.ignition.speculative_plan import DRAFT_WEIGHTS_RESOURCE, SpeculativePlan
from helios.ignition.window_split import window_tokens
from helios.runtime.cache.window_pages import window_page_count
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.execution.executor import Executor
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.execution.packer import Packer
from helios.runtime.execution.program_variants import program_table
from helios.runtime.loading.model import LoadedModel, _allocate, select_handles
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason, PromptScoresEvent, TokenEvent, TokenLogprobs
from helios.runtime.records.plan import StepPlan
from helios.runtime.records.request import RequestSpec, RequestStatus
from helios.runtime.records.sampling_params import GREEDY, SamplingParams
from helios.runtime.records.stats import WorkerStats
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler
from speculative.support import WEIGHTS_RESOURCE, _declaration, _program, truncated

PAGE_TOKENS = 4
CONTEXT = 64
UNUSED = Path("draft-is-given-directly")
SAMPLED = (0.8, 0.0, 0.9, 0.0, 1.0, 0.0, 0.0)  # temperature 0.8, top-p 0.9
FAULT = "injected device fault"


class AllowAll:
    """A grammar matcher that allows every token: its lanes take the constrained path (a mask
    before every sampled token, one round in flight) and keep the unconstrained output."""

    def fill_bitmask(self, row: torch.Tensor) -> None:
        row.fill_(-1)

    def consume_token(self, token_id: int) -> bool:
        return True

# Where a cancellation is aimed (`Planned.cancel`).
INGRESS, WAITING, PROMPT, DECODE = "ingress", "waiting", "prompt", "decode"
SPECULATING, TOKENS = "speculating", "tokens"


def capacity_plan(width: int | None, allocate: bool = False, per_lane: int | None = None,
                  draft_tokens: int | None = None, scored: bool = True) -> CapacityPlan:
    speculative = SpeculativePlan(UNUSED, widths=(width,), allocate_prefixes=allocate, packed_per_lane=per_lane,
                                  draft_tokens=draft_tokens) if width else None
    return CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=CONTEXT, prefill_tokens=16, decode_batches=(1, 4),
                        scored_prefill=scored, speculative=speculative)


def stress_model(recipe, draft, plan: CapacityPlan, startup: StartupOptions = StartupOptions(),
                 num_pages: int | None = None, window_pages: int | None = None) -> LoadedModel:
    """A LoadedModel of `plan`'s programs and their token-logprobs twins as eager modules, with the
    history regions `helios prepare` declares for `recipe` (a sliding window when every layer slides,
    a window region of its own pages when some do and no draft keeps one region)."""
    arch = recipe.architecture
    options = plan.speculative.options(draft.architecture) if plan.speculative else ProgramOptions()
    options = dataclasses.replace(options, attention_tuning=plan.attention_tuning)
    captures = [(op, capacity, False) for op, capacity in plan.variants()]
    captures += [(op, capacity, True) for op, capacity in plan.logprob_variants()]
    specs = {}
    for operation, capacity, logprobs in captures:
        spec = program_spec(arch, operation, capacity, plan.page_tokens,
                            dataclasses.replace(options, token_logprobs=logprobs))
        label = f"{capacity.batch_capacity}.{capacity.verify_tokens}.{capacity.packed_token_capacity}"
        specs[f"{operation.value}{'_logprobs' if logprobs else ''}.{label}"] = spec
    programs = [ProgramResource(spec, resource_id) for resource_id, spec in specs.items()]
    declaration = dataclasses.replace(  # (recurrent state: continuation rows for two snapshots per request)
        _declaration(recipe, plan), history_window=history_window(arch.layer_windows),
        split_window=window_tokens(arch, options),
        snapshot_capacity=2 * plan.max_concurrency if arch.recurrent is not None else 0)
    prepared = declare_paged_text(declaration, programs, [WEIGHTS_RESOURCE],
                                  DRAFT_WEIGHTS_RESOURCE if draft is not None else None)
    settings = resolve_settings(prepared, startup)
    handles = select_handles(prepared, settings.max_concurrency, 0, settings.speculative_widths)
    loaded = []
    for handle in handles:
        program = _program(prepared, handle, specs[handle.resource_id], arch)
        graph = prepared.graphs[handle.graph]
        returns = set(TOKEN_LOGPROB_OUTPUTS) <= set(handle.program_outputs)  # as `load_program` reads them
        loaded.append(dataclasses.replace(program, token_logprobs=graph.token_logprobs, returns_token_logprobs=returns))
    weights = {f"w.{w.name}": w.tensor for w in recipe.weights}
    if draft is not None:
        weights.update({f"w.{DRAFT_PREFIX}{w.name}": w.tensor for w in draft.weights})
    pages = num_pages or settings.page_capacity
    rows = settings.max_concurrency
    row_tokens = max(p.packed_token_capacity for p in loaded)
    num_window_pages = window_page_count(prepared, rows, row_tokens, -(-plan.context_tokens // plan.page_tokens),
                                         window_pages)
    buffers = _allocate(prepared, pages, rows, torch.device("cpu"), num_window_pages)
    return LoadedModel(prepared, settings, tuple(loaded), MappingProxyType(weights), MappingProxyType(buffers),
                       pages, rows, b"", "", torch.device("cpu"), num_window_pages=num_window_pages)


def stress_engine(model: LoadedModel, policy: SchedulerPolicy, host_pages: int = 0, queue_capacity: int = 256,
                  frames: int = 1) -> Engine:
    packer = Packer(model.prepared, model.buffers, 1)
    executor = Executor(model, packer, program_table(model), host_pages)
    scheduler = Scheduler.create(capacities_for(model, queue_capacity, host_pages), policy)
    return Engine(scheduler, executor, WorkerStats(), frames=frames)


class Alone(NamedTuple):
    """A request's output run alone on a fresh engine: tokens and, when asked, prompt scores."""

    tokens: list[int]
    scores: list[TokenLogprobs]


def run_alone(recipe, spec: RequestSpec) -> Alone:
    """`spec`'s output alone on a fresh plain engine (no speculation, pages to spare)."""
    plan = capacity_plan(None, scored=recipe.architecture.recurrent is None)
    return alone_on(stress_engine(stress_model(recipe, None, plan), SchedulerPolicy(speculative=False)), spec)


def alone_on(engine: Engine, spec: RequestSpec) -> Alone:
    """`spec`'s output as the only request of an idle `engine`; it must end by its length."""
    tokens, scores, finishes = [], [], []

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, PromptScoresEvent):
            scores.extend(event.scores)
        else:
            finishes.append(event)

    engine.submit(EngineRequest(spec, record))
    engine.run_until_idle()
    assert [f.reason for f in finishes] == [FinishReason.LENGTH], finishes
    return Alone(tokens, scores)


@dataclass(frozen=True)
class Scenario:
    seed: int
    width: int | None = 4  # speculative width (None: no SPECULATIVE programs)
    draft: str = "truncated"  # "self", "truncated" (the target's first layer) or "none"
    history_drafting: bool = False
    preemption: PreemptionMode = PreemptionMode.RECOMPUTE
    num_pages: int = 20
    host_pages: int = 0
    frames: int = 1
    queue_capacity: int = 3
    num_requests: int = 36
    logprobs: float = 0.1  # share of requests asking for log-probabilities
    allocate: bool = False  # SPECULATIVE programs allocate prefixes on the device (PREFIX_LIMIT lengths)
    per_lane: int | None = None  # packed tokens per lane of SPECULATIVE programs (None: the width)
    draft_tokens: int | None = None
    prefix_caching: bool = True
    two_frames: bool = True
    snapshots: float = 0.0  # share of requests publishing a snapshot of their end
    constrained: float = 0.1  # share of requests under a grammar (one that allows every token)
    biased: float = 0.05  # share of prompts with a logit bias
    scored: float = 0.05  # share of prompts asking for prompt scores
    sampled: float = 0.0  # share of prompts sampled with a seed (exact only without speculation)
    family: str = "llama3"
    reuse: float = 0.1  # chance that an arriving request takes the id of one that ended
    turns: float = 0.15  # share of prompts continuing an earlier one (its prompt and output)
    faults: float = 0.0  # chance that a plan fails (before its launch, after its program ran, or at finish)

    def __post_init__(self) -> None:
        if self.sampled and self.draft != "none":  # speculative sampling keeps the distribution, not the draws
            raise ValueError("sampled requests are exact only without speculation")


@dataclass
class Planned:
    """One request of the run: what it asks, what it must deliver, what the run does to it."""

    spec: RequestSpec
    expected: list[int]  # its output when it ends by itself
    natural: FinishReason  # how it ends by itself
    cancel: str | None = None  # the phase a cancellation is aimed at
    cancel_after: int = 0  # TOKENS: cancelled at this many tokens
    frontend_stop: int = 0  # stop_matched after this many tokens (0: none)
    raise_at: int = 0  # its on_event raises at this many tokens (0: never)
    stop_sequence: tuple[int, ...] = ()
    tokens: list[int] = field(default_factory=list)
    token_events: list[TokenEvent] = field(default_factory=list)
    finishes: list[FinishEvent] = field(default_factory=list)
    late_events: int = 0  # events after its finish
    cancelled_in: str | None = None  # the phase the cancellation was sent in
    stop_sent: int = 0  # the count sent with stop_matched
    raised: bool = False
    submitted: bool = False
    matched: list[int] = field(default_factory=list)  # the host stop's window
    scores: list[TokenLogprobs] = field(default_factory=list)  # its prompt scores alone
    score_events: list[PromptScoresEvent] = field(default_factory=list)
    reuses: bool = False  # it took the id of a request that ended (it may be rejected as a duplicate)
    reused: bool = False  # a later request took its id


def draft_of(recipe, kind: str):
    """The draft model of a scenario: the target itself, its first layer, or none."""
    if kind == "none":
        return None
    return recipe if kind == "self" else truncated(recipe, 1)


class StressRun:
    """One run of `scenario` over `recipe` (see the module docstring). Single-threaded."""

    def __init__(self, scenario: Scenario, recipe):
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        width = scenario.width if scenario.draft != "none" else None
        startup = StartupOptions(history_drafting=scenario.history_drafting)
        scored = recipe.architecture.recurrent is None  # (hybrid recurrent decoders score no prompts)
        plan = capacity_plan(width, scenario.allocate, scenario.per_lane, scenario.draft_tokens, scored)
        self.model = stress_model(recipe, draft_of(recipe, scenario.draft), plan, startup, scenario.num_pages)
        policy = SchedulerPolicy(preemption=scenario.preemption, prefix_caching=scenario.prefix_caching,
                                 two_frames=scenario.two_frames)
        self.engine = stress_engine(self.model, policy, scenario.host_pages, scenario.queue_capacity,
                                    scenario.frames)
        self.plans: list[StepPlan] = []
        self.operations: Counter = Counter()
        self.cancels_sent: Counter = Counter()
        self.finished_cancels = 0
        self.shutdown = False  # `run_threaded`: requests may end CANCELLED by the shutdown
        self.failed_ids: set[str] = set()  # requests of plans that failed
        self._failing: set[int] = set()  # plans that fail at finish
        self.planned = self._plan_requests(recipe)
        self._queue = list(self.planned)  # not yet submitted, in arrival order
        self._hook_executor()

    # -- the requests --------------------------------------------------------------------------

    def _plan_requests(self, recipe) -> list[Planned]:
        """Request shapes first (prompt, limit, what decides the output), then each distinct
        shape's output alone, then what the run does to each request."""
        rng, scenario = self.rng, self.scenario
        vocab = recipe.architecture.vocab_size
        shared = [[rng.randrange(1, vocab - 1) for _ in range(24)] for _ in range(3)]
        shapes: list[tuple[RequestSpec, int]] = []
        outputs: dict[RequestSpec, Alone] = {}  # by shape with output limit 1: its longest output alone

        def alone(shape: RequestSpec, limit: int) -> Alone:
            key = dataclasses.replace(shape, request_id="", max_output_tokens=1)
            if key not in outputs or len(outputs[key].tokens) < limit:
                outputs[key] = run_alone(recipe, dataclasses.replace(key, max_output_tokens=limit))
            return outputs[key]

        while len(shapes) < scenario.num_requests:
            prefix = rng.choice(shared)[:rng.randrange(0, 25)] if rng.random() < 0.7 else []
            stable = 0
            short = [(shape, limit) for shape, limit in shapes if len(shape.prompt_ids) + limit < CONTEXT - 26]
            if short and rng.random() < scenario.turns:  # a later turn: an earlier prompt, its output, more
                earlier, limit = rng.choice(short)
                prefix = list(earlier.prompt_ids) + alone(earlier, limit).tokens[:limit]
                stable = len(earlier.prompt_ids)
            tail = [rng.randrange(1, vocab - 1) for _ in range(rng.randrange(1, 20))]
            prompt = tuple(prefix + tail)[:CONTEXT - 24]
            options = {"stable_prefix_len": min(stable, len(prompt))}
            if rng.random() < scenario.biased:  # a strong bias against a token (plain programs only)
                banned, favoured = rng.sample(range(1, vocab - 1), 2)
                options["logit_bias"] = ((banned, -100.0), (favoured, 5.0))
            if rng.random() < scenario.scored and recipe.architecture.recurrent is None:
                options["score_prompt"] = True
            sampled = rng.random() < scenario.sampled
            copies = rng.choice([2, 3]) if rng.random() < 0.15 else 1  # n choices of one prompt
            for _ in range(copies):
                limit = 1 if rng.random() < 0.15 else rng.randrange(2, 24)
                sampling = SamplingParams.from_packed(SAMPLED, rng.randrange(2**31)) if sampled else GREEDY
                shapes.append((RequestSpec("", prompt, limit, sampling=sampling, **options), limit))
        return [self._planned(dataclasses.replace(shape, request_id=f"r{index}"), alone(shape, limit), limit)
                for index, (shape, limit) in enumerate(shapes)]

    def _planned(self, shape: RequestSpec, alone: Alone, limit: int) -> Planned:
        rng, scenario = self.rng, self.scenario
        options = {}
        reference = alone.tokens[:limit]
        expected, natural = list(reference), FinishReason.LENGTH
        stop_sequence: tuple[int, ...] = ()
        if rng.random() < 0.2:  # an EOS id that occurs in its output
            eos = rng.choice(reference)
            options["eos_ids"] = frozenset({eos})
            end = reference.index(eos) + 1
            expected, natural = reference[:end], FinishReason.EOS
        if rng.random() < 0.2 and len(reference) >= 2:  # a stop sequence that occurs in its output
            end = rng.randrange(1, len(reference) + 1)
            stop_sequence = tuple(reference[max(0, end - rng.choice([1, 2])):end])
            options["stop_token_sequences"] = (stop_sequence,)
            first = _first_end(reference, stop_sequence)
            if first < len(expected):  # (at the same token, EOS or the limit ends it first)
                expected, natural = reference[:first], FinishReason.STOP
        if rng.random() < scenario.logprobs:
            options["top_logprobs"] = rng.randrange(0, 4)
        options["constrained"] = rng.random() < scenario.constrained
        options["priority"] = rng.choice([0, 0, 1])
        options["publish_snapshot"] = rng.random() < scenario.snapshots
        options["observe"] = rng.random() < 0.2
        spec = dataclasses.replace(shape, **options)
        planned = Planned(spec, expected, natural, stop_sequence=stop_sequence, scores=alone.scores)
        kind = rng.random()
        if kind < 0.3:
            planned.cancel = rng.choice([INGRESS, WAITING, PROMPT, DECODE, SPECULATING, TOKENS])
            planned.cancel_after = rng.randrange(1, limit + 1)
        elif kind < 0.38:
            planned.frontend_stop = rng.randrange(1, limit + 1)
        elif kind < 0.43:
            planned.raise_at = rng.randrange(1, limit + 1)
        return planned

    # -- driving -------------------------------------------------------------------------------

    def run(self) -> None:
        while self._queue:
            for _ in range(self.rng.randrange(1, 7)):
                self._arrive()
            self.engine.run_until_idle()
        assert self.engine.is_healthy and self.engine.failure is None

    def run_threaded(self, ended_before_shutdown: int) -> None:
        """The engine on its worker thread: arrivals and cancellations come from its hooks (and a
        first burst from here); once `ended_before_shutdown` requests ended it is shut down with
        requests queued, running and still in the ingress channel, and one more is submitted."""
        self.shutdown = True
        for _ in range(6):
            self._arrive()
        self.engine.start()
        deadline = time.monotonic() + 120
        while sum(bool(p.finishes) for p in self.planned) < ended_before_shutdown and time.monotonic() < deadline:
            time.sleep(0.001)
        self.engine.shutdown()
        assert not self.engine._thread.is_alive()
        while self._queue:
            self._arrive()  # after shutdown: each ends at once
        assert self.engine.is_healthy and self.engine.failure is None

    def _arrive(self) -> None:
        """Submits the next request (with the rest of its group: one prompt, consecutive)."""
        if not self._queue:
            return
        first = self._queue.pop(0)
        group = [first]
        while self._queue and self._queue[0].spec.prompt_ids == first.spec.prompt_ids and len(group) < 3:
            group.append(self._queue.pop(0))
        for planned in group:
            # (never an id a cancellation was sent for: it may still be on its way)
            ended = [p for p in self.planned if p.finishes and not p.reused and not p.cancelled_in]
            if ended and self.rng.random() < self.scenario.reuse:
                previous = self.rng.choice(ended)
                previous.reused = planned.reuses = True
                planned.spec = dataclasses.replace(planned.spec, request_id=previous.spec.request_id)
            planned.submitted = True
            host_stop = self._host_stop(planned) if planned.stop_sequence else None
            grammar = AllowAll() if planned.spec.constrained else None
            self.engine.submit(EngineRequest(planned.spec, self._on_event(planned), grammar, host_stop))
            if planned.cancel == INGRESS:
                self._cancel(planned, INGRESS)

    def _host_stop(self, planned: Planned) -> Callable[[int], bool]:
        def matched(token: int) -> bool:
            planned.matched.append(token)
            return tuple(planned.matched[-len(planned.stop_sequence):]) == planned.stop_sequence

        return matched

    def _on_event(self, planned: Planned):
        def on_event(event) -> None:
            if planned.finishes:
                planned.late_events += 1
            if isinstance(event, FinishEvent):
                planned.finishes.append(event)
                return
            if isinstance(event, PromptScoresEvent):
                planned.score_events.append(event)
                return
            planned.tokens.extend(event.token_ids)
            planned.token_events.append(event)
            count = len(planned.tokens)
            self._chance_events()
            if planned.cancel == TOKENS and count >= planned.cancel_after and not planned.cancelled_in:
                self._cancel(planned, TOKENS)
            if planned.frontend_stop and count >= planned.frontend_stop and not planned.stop_sent:
                planned.stop_sent = max(1, count - self.rng.randrange(0, 2))
                self.engine.stop_matched(planned.spec.request_id, planned.stop_sent)
            if planned.raise_at and count >= planned.raise_at and not planned.raised:
                planned.raised = True
                raise RuntimeError("stress hook failed")

        return on_event

    def _chance_events(self) -> None:
        rng = self.rng
        if rng.random() < 0.08:
            self._arrive()
        if rng.random() < 0.02:  # cancelling an ended request changes nothing
            ended = [p for p in self.planned if p.finishes and not p.cancelled_in and not p.reused]
            if ended:
                self.finished_cancels += 1
                self._cancel(rng.choice(ended), "ended")

    def _hook_executor(self) -> None:
        executor = self.engine.executor
        launch, finish = executor.launch, executor.finish

        def hooked(plan: StepPlan, *, alone: bool = False):
            self._on_plan(plan)
            fault = self._fault(plan)
            if fault == "launch":
                raise ExecutionError(FAULT)
            launched = launch(plan, alone=alone)
            if fault == "launched":
                raise ExecutionError(FAULT)
            if fault == "finish":
                self._failing.add(plan.sequence)
            return launched

        def finishing(launched):
            output = finish(launched)
            if launched.plan.sequence in self._failing:
                raise ExecutionError(FAULT)
            return output

        executor.launch, executor.finish = hooked, finishing

    def _fault(self, plan: StepPlan) -> str | None:
        """Where `plan` fails, if it does; its requests may then end ERROR."""
        if not plan.rows or self.rng.random() >= self.scenario.faults:
            return None
        self.failed_ids.update(row.request_id for row in plan.rows)
        return self.rng.choice(["launch", "launched", "finish"])

    def _on_plan(self, plan: StepPlan) -> None:
        """Before a plan runs: record it, maybe an arrival, and cancellations aimed at this phase."""
        self.plans.append(plan)
        self.operations[plan.operation.name] += 1
        if self.rng.random() < 0.3:
            self._arrive()
        rows = {row.request_id: row for row in plan.rows}
        scheduler = self.engine.scheduler
        for planned in self.planned:
            if not planned.submitted or planned.cancelled_in or planned.finishes or planned.cancel in (None, TOKENS):
                continue
            row = rows.get(planned.spec.request_id)
            view = scheduler.view(planned.spec.request_id)
            phase = None
            if planned.cancel == WAITING and view is not None and view.status == RequestStatus.WAITING:
                phase = WAITING
            elif row is not None and planned.cancel == PROMPT and not row.samples:
                phase = PROMPT
            elif row is not None and planned.cancel == DECODE and plan.operation == Operation.DECODE:
                phase = DECODE
            elif row is not None and planned.cancel == SPECULATING and plan.operation == Operation.SPECULATIVE:
                phase = SPECULATING
            if phase is not None and self.rng.random() < 0.6:
                self._cancel(planned, phase)

    def _cancel(self, planned: Planned, phase: str) -> None:
        planned.cancelled_in = phase
        self.cancels_sent[phase] += 1
        self.engine.cancel(planned.spec.request_id)

    # -- checks --------------------------------------------------------------------------------

    def check(self) -> Counter:
        """Asserts what must hold (module docstring); returns the finish reasons' counts."""
        reasons: Counter = Counter()
        for planned in self.planned:
            _check_request(planned, planned.spec.request_id in self.failed_ids, self.shutdown)
            reasons[planned.finishes[0].reason] += 1
        self.check_idle()
        stats = self.engine.stats  # the worker's counts agree with what the requests saw
        assert stats.generated_tokens == sum(len(p.tokens) for p in self.planned)
        if not self.shutdown:  # (requests submitted after shutdown, which end at once, are not counted)
            # (a request cancelled while still in the ingress channel was never admitted, but is counted)
            finished = Counter({reason.name.lower(): count for reason, count in reasons.items()})
            del finished["rejected"]
            assert stats.requests_finished == +finished, (stats.requests_finished, finished)
            assert stats.requests_rejected == reasons[FinishReason.REJECTED]
            never_admitted = len(self.planned) - reasons[FinishReason.REJECTED] - stats.requests_admitted
            assert 0 <= never_admitted <= self.cancels_sent[INGRESS]
        return reasons

    def check_idle(self) -> None:
        engine = self.engine
        scheduler = engine.scheduler
        assert not scheduler.has_work and not scheduler.queues.requests
        scheduler.check_invariants()
        assert scheduler.slots.num_free == scheduler.slots.num_slots
        cache = scheduler.cache
        snapshots = cache.snapshots.snapshots()
        assert all(s.owner is None and s.ready and not s.is_busy for s in snapshots), snapshots
        held = set(cache.snapshots.page_holders())
        pool = cache.pool
        for page in range(pool.num_pages):
            assert pool.allocator.is_free(page) or pool.cache.is_parked(page) or page in held, f"page {page} held"
        assert not cache.groups.num_members, "a prompt group kept a member"
        assert not engine._active and not engine.feedback.watching and not engine.outbox._uncounted
        pending = set(scheduler._released_ids)  # dropped by the packers with the next plan
        packer = engine.executor.packer
        assert all(request_id in pending for request_id in packer._requests), (set(packer._requests) - pending)
        engine.refresh_gauges()
        assert engine.stats.active_requests == 0 and engine.stats.queued_requests == 0


def _first_end(tokens: list[int], sequence: tuple[int, ...]) -> int:
    """The end of `sequence`'s first occurrence in `tokens` (len(tokens) + 1 when absent)."""
    width = len(sequence)
    for end in range(width, len(tokens) + 1):
        if tuple(tokens[end - width:end]) == sequence:
            return end
    return len(tokens) + 1


def _check_request(planned: Planned, in_failed_plan: bool, shut_down: bool = False) -> None:
    spec, name = planned.spec, planned.spec.request_id
    assert len(planned.finishes) == 1 and not planned.late_events, f"{name}: {planned.finishes}"
    finish = planned.finishes[0]
    tokens, expected, reason = planned.tokens, planned.expected, finish.reason
    assert finish.num_prompt_tokens == len(spec.prompt_ids), name
    assert tokens == expected[:len(tokens)] and len(tokens) <= len(expected), f"{name}: {tokens} vs {expected}"
    frontend_stop = reason == FinishReason.STOP and planned.stop_sent and (
        planned.natural != FinishReason.STOP or tokens != expected)
    if frontend_stop:
        assert finish.num_output_tokens == min(planned.stop_sent, len(tokens)), f"{name}: {finish}"
    else:
        assert finish.num_output_tokens == len(tokens), f"{name}: {finish} for {len(tokens)} tokens"
    if reason == FinishReason.REJECTED:
        assert planned.reuses and not tokens and "already active" in finish.message, f"{name}: {finish}"
    elif reason == FinishReason.CANCELLED:
        assert planned.cancelled_in or shut_down, f"{name}: cancelled without a cancellation"
    elif reason == FinishReason.ERROR and finish.message == FAULT:
        assert in_failed_plan, f"{name}: {finish}"
    elif reason == FinishReason.ERROR:
        assert planned.raised and "RuntimeError: stress hook failed" in finish.message, f"{name}: {finish}"
    elif not frontend_stop:
        assert (reason, tokens) == (planned.natural, expected), (
            f"{name}: {reason.name} after {tokens}, expected {planned.natural.name} after {expected}")
    for event in planned.token_events:
        assert (event.observed_ns is not None) == spec.observe, name
        if spec.top_logprobs is None:
            assert event.logprobs is None, name
            continue
        assert event.logprobs is not None and len(event.logprobs) == len(event.token_ids), name
        for token, logprobs in zip(event.token_ids, event.logprobs):
            assert len(logprobs.top) == spec.top_logprobs, name
            if logprobs.top and spec.sampling.is_greedy:  # the sampled token is the most probable (or tied)
                assert logprobs.top[0][0] == token or logprobs.top[0][1] == logprobs.logprob, name
    _check_scores(planned)


def _check_scores(planned: Planned) -> None:
    """Prompt scores cover the prompt (every token but the first) before the first output token,
    each as it came alone. (A request preempted while scoring is scored again from its start, so
    an index may come twice, with the same values; the frontend keeps one entry per index.)"""
    name, events = planned.spec.request_id, planned.score_events
    if not planned.spec.score_prompt:
        assert not events, name
        return
    scores = {}
    for event in events:
        for offset, score in enumerate(event.scores):
            index = event.first_index + offset
            assert abs(score.logprob - planned.scores[index - 1].logprob) < 1e-3, f"{name}: {index} {score}"
            scores[index] = score
    if planned.tokens:
        assert sorted(scores) == list(range(1, len(planned.spec.prompt_ids))), f"{name}: scored {sorted(scores)}"

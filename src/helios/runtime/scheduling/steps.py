"""Step composition: the cohort, each lane's tokens and pages, and the program of one step.

`StepBuilder` reads completed observations only (the counters of each request) and decides:
- the operation: DECODE when every chosen lane has only its pending token left; PREFILL when
  only prompts (or recomputation) remain; MIXED when both (without a MIXED program, prompt and
  decode steps alternate); SCORED_PREFILL for prompts that need scores (alternating with the
  rest); SPECULATIVE instead of DECODE when loaded and enabled, unless a decoding lane asks for
  log-probabilities and the SPECULATIVE programs have no token-logprobs twins (the executor runs
  DECODE's token-logprobs variant for it, or SPECULATIVE's where it has one), has a logit bias and
  the SPECULATIVE programs apply none (a core prepared before they took one), or the decoding lanes
  outnumber the widest SPECULATIVE program's rows (and instead of a MIXED step whose waiting head
  could not be admitted, which holds decoding lanes alone);
- the lanes, in scheduling order (priority, then submission), within the program's row and
  packed-token capacities and the prefill extent; a prompt longer than what is left of the
  extent is chunked, and one token stays reserved for every later decoding lane;
- pages: each lane's page table is grown to cover its new positions. Allocation itself evicts
  parked pages (LRU) and drops idle published snapshots (LRU). On a remaining shortage the
  builder waits when copies in this plan will return enough pages at their fence, otherwise it
  preempts a victim: the running request not yet scheduled in this step with the largest
  (priority, submission) key - lowest priority first, then the latest submitted; that may be
  the requesting lane itself. A step that preempted admits no waiting request, and waiting
  requests never preempt running ones;
- admission, in queue order: a request whose prompt a running request is still computing waits
  for it (then shares its pages and computes one prompt token; `prompt_sharing`), and so does
  everything queued behind it;
- RESUME: a prompt-only step holding a lane that continues from a nonzero committed endpoint at
  its slot generation's first row (readmitted after preemption, or restored from a snapshot or
  cached pages) runs the core's RESUME program when it declares one that holds the step (and no
  lane needs what RESUME programs do not take: images, log-probabilities); fresh lanes of the same
  step continue from endpoint 0.

The second frame (`build_second`) repeats a plain decode cohort with device-owned pending
tokens, only when nothing would change phase and no active request needs host feedback. A fresh
step of a steady decode cohort (the last step decoded and nothing else can happen) is composed
directly by `helios.runtime.scheduling.steady`, the same plan as the general path's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helios.runtime.cache.cache_manager import CacheManager, CopyWork, Fence
from helios.runtime.records.capacities import Capacities, LengthSource, Operation, ProgramVariant
from helios.runtime.records.faults import require
from helios.runtime.records.plan import CopyOp, PlanRow
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.scheduling.queues import RequestQueues
from helios.runtime.records.request import RequestState, RequestStatus
from helios.runtime.scheduling.slots import SlotTable
from helios.runtime.scheduling.steady import steady_decode, steady_second
from helios.runtime.cache.snapshots import FenceKind, Residence

DECODING_OPS = (Operation.DECODE, Operation.MIXED, Operation.SPECULATIVE)

# Lane kinds, from a running request's counters.
IDLE, DECODE, PROMPT, SCORING = 0, 1, 2, 3  # nothing ahead / pending token only / prompt / scored prompt
_TAKES = {
    Operation.DECODE: frozenset({DECODE}),
    Operation.SPECULATIVE: frozenset({DECODE}),
    Operation.MIXED: frozenset({DECODE, PROMPT}),
    Operation.PREFILL: frozenset({PROMPT}),
    Operation.SCORED_PREFILL: frozenset({SCORING}),
}


@dataclass
class Draft:
    """A step under construction; becomes a StepPlan. Mutated only by `StepBuilder`."""

    operation: Operation
    variant: ProgramVariant | None = None
    rows: list[PlanRow] = field(default_factory=list)
    requests: list[RequestState] = field(default_factory=list)
    copies: list[CopyOp] = field(default_factory=list)
    fences: list[Fence] = field(default_factory=list)
    num_tokens: int = 0
    scheduled: set[str] = field(default_factory=set)
    reclaiming: int = 0  # pages referenced only until this plan's copies complete
    preempted: bool = False

    def add_work(self, work: CopyWork) -> None:
        self.copies.extend(work.copies)
        self.fences.extend(work.fences)


def is_scoring(req: RequestState) -> bool:
    """Its prompt still needs scored prefill."""
    return req.spec.score_prompt and req.num_output_tokens == 0


def _drafts_drawn(lanes: list[tuple[RequestState, int, int]]) -> bool:
    """Whether a decoding lane speculates with drawn (sampled) proposals. Device prefix allocation
    admits a proposal by its own confidence, a function of the draw that proposed it; where lanes
    compete for P, verifying a drawn proposal only when it came out likely skews a sampled lane's
    tokens away from the target's distribution (the bonus draw after the last verified position
    shares that draw's uniform too). So a round holding such a lane keeps its ceilings within P,
    which the allocation then grants whole, independently of any confidence; a greedy lane's
    proposals are functions of its history, so greedy lanes compete."""
    return any(kind == DECODE and not req.spec.sampling.is_greedy and not req.spec.single_lane
               for req, _, kind in lanes)


class StepBuilder:
    def __init__(self, caps: Capacities, policy: SchedulerPolicy, cache: CacheManager,
                 slots: SlotTable, queues: RequestQueues):
        self.caps = caps
        self.policy = policy
        self.cache = cache
        self.slots = slots
        self.queues = queues
        self.last_operation = Operation.UNSPECIFIED
        self.num_preemptions = 0
        self.steady = True  # compose steady decode steps directly (`steady`); False: always the general path
        self._speculative_rows = caps.limits(Operation.SPECULATIVE)[0]  # the widest SPECULATIVE program's

    # -- fresh steps (no plan in flight) -------------------------------------------------------

    def build(self, pending: CopyWork) -> Draft | None:
        if self.steady and not (pending.copies or pending.fences):
            draft = Draft(Operation.DECODE)
            if steady_decode(self, draft):  # the last step's decode cohort again, one position on
                return draft
        draft = Draft(Operation.UNSPECIFIED)
        draft.add_work(pending)
        self._offload_published(draft)
        lanes = self._classify()
        operation = self._choose_operation(lanes)
        if operation is not None:
            self._fill(draft, operation, lanes)
            if not draft.rows and operation not in DECODING_OPS:
                self._fill_instead(draft, operation, lanes)
            elif operation == Operation.MIXED and self._speculates_instead(draft):
                self._refill_speculative(draft)
        if not draft.rows:
            draft.operation = Operation.UNSPECIFIED
            return draft if draft.copies else None
        self._finalize(draft)
        self.last_operation = draft.operation
        return draft

    def _classify(self) -> list[tuple[RequestState, int, int]]:
        """(request, tokens ahead, lane kind) for each running request, in scheduling order."""
        lanes = []
        for req in self.queues.running:
            ahead = req.num_tokens_ahead
            if ahead <= 0:
                kind = IDLE
            elif req.spec.score_prompt and is_scoring(req):
                kind = SCORING
            else:
                kind = DECODE if ahead == 1 else PROMPT
            lanes.append((req, ahead, kind))
        return lanes

    def _choose_operation(self, lanes: list[tuple[RequestState, int, int]]) -> Operation | None:
        kinds = {kind for _, _, kind in lanes}
        decode, prompt, scoring = DECODE in kinds, PROMPT in kinds, SCORING in kinds
        if self.queues.waiting and self.slots.num_free:
            head = self.queues.waiting[0]
            scoring, prompt = scoring or is_scoring(head), prompt or not is_scoring(head)
        if scoring and (self.last_operation != Operation.SCORED_PREFILL or not (decode or prompt)):
            return Operation.SCORED_PREFILL
        if prompt and decode:
            if self.caps.has(Operation.MIXED):
                return Operation.MIXED
            return self._prefill_operation() if self.last_operation in DECODING_OPS else self._decode_operation()
        if prompt:
            return self._prefill_operation()
        if decode:
            return self._decode_operation()
        return None

    def _fill_instead(self, draft: Draft, tried: Operation, lanes: list[tuple[RequestState, int, int]]) -> None:
        """The prompt operation chosen scheduled nothing (its waiting head cannot be admitted, its
        lanes found no pages): fill the first other operation that has running lanes of its kind
        (scored prompts, prompts, decoding lanes), so that neither kind waits on the other for
        good (alternation would choose the empty operation again at every step)."""
        kinds = {kind for _, _, kind in lanes}
        others = [Operation.SCORED_PREFILL, self._prefill_operation(), self._decode_operation()]
        if self.caps.has(Operation.MIXED):
            others.insert(1, Operation.MIXED)
        for operation in others:
            if operation != tried and kinds & _TAKES[operation] and not draft.rows:
                self._fill(draft, operation, self._classify())

    def _speculates_instead(self, draft: Draft) -> bool:
        """Whether a filled MIXED step holds decoding lanes alone (its waiting head could not be
        admitted: too few pages, or it waits for a running source) on a core that would speculate
        for them: `_finalize` would run it as a plain DECODE step, one token a lane, for as long as
        the head stays blocked (until a running request ends, when pages are short). A step that
        preempted keeps its rows (the victim's pages went to them), and so does one that admitted a
        slot (a prompt of one token left to compute is such a row too)."""
        return (bool(draft.rows) and not draft.preempted
                and all(row.query_len == 1 and row.samples and not row.admits for row in draft.rows)
                and self._decode_operation() is Operation.SPECULATIVE)

    def _refill_speculative(self, draft: Draft) -> None:
        """Undo the MIXED rows' counters (`_add_row`) and fill the step as SPECULATIVE. The pages
        they grew stay (a speculative lane grows at least as far), and so do the copies and fences
        of prompt checkpoints their rows requested: they run before the program either way."""
        for row, req in zip(draft.rows, draft.requests):
            req.num_inflight_tokens -= row.query_len
            req.num_pending_samples -= row.samples
            req.num_uploaded_pages = row.page_table_start
        draft.rows.clear()
        draft.requests.clear()
        draft.scheduled.clear()
        draft.num_tokens = 0
        self._fill(draft, Operation.SPECULATIVE, self._classify())

    def _decode_operation(self) -> Operation:
        if (self.policy.speculative and self.caps.has(Operation.SPECULATIVE) and not self._needs_plain_sampling()
                and self._speculation_holds_cohort()):
            return Operation.SPECULATIVE
        return Operation.DECODE if self.caps.has(Operation.DECODE) else Operation.MIXED

    def _speculation_holds_cohort(self) -> bool:
        """Whether the widest SPECULATIVE program holds every decoding lane. One narrower than the
        cohort (`--speculative-batches` below the decode batches) would take the same first lanes in
        scheduling order round after round, each until it ends, and leave the others without a token
        meanwhile (eight lanes beside two-row programs took 43 decoding steps, plain decoding 22): such a
        cohort decodes plainly, every lane a step (through MIXED programs on a core without DECODE
        ones), and speculates again once it fits."""
        rows = self._speculative_rows
        if rows >= self.caps.max_active:
            return True
        return sum(req.num_tokens_ahead == 1 and not is_scoring(req) for req in self.queues.running) <= rows

    def _needs_plain_sampling(self) -> bool:
        """A decoding lane has a logit bias where the SPECULATIVE programs apply none (a core
        prepared before they took the bias inputs) or asks for log-probabilities where they have no
        token-logprobs twins (the executor runs the twins when they do). Only decoding lanes count,
        as a SPECULATIVE step holds no other: a request still computing its prompt samples in a
        prompt step (a long prompt, chunked, once turned every decode step between its chunks into
        a plain one)."""
        bias_plain, logprobs_plain = not self.caps.speculative_logit_bias, not self.caps.speculative_logprobs
        return any(((bias_plain and req.spec.has_logit_bias) or (logprobs_plain and req.spec.top_logprobs is not None))
                   and req.num_tokens_ahead == 1 and not is_scoring(req) for req in self.queues.running)

    def _prefill_operation(self) -> Operation:
        return Operation.PREFILL if self.caps.has(Operation.PREFILL) else Operation.MIXED

    def _fill(self, draft: Draft, operation: Operation, lanes: list[tuple[RequestState, int, int]]) -> None:
        draft.operation = operation
        max_rows, max_tokens = self.caps.limits(operation)
        takes = _TAKES[operation]
        num_decoders = sum(kind == DECODE for _, _, kind in lanes) if DECODE in takes else 0
        if operation not in (Operation.DECODE, Operation.SPECULATIVE):
            # The prefill extent bounds prompt tokens; a MIXED step's decoding lanes come on top
            # (its program holds prefill + rows tokens), up to the program's capacity.
            max_tokens = min(max_tokens, self.caps.prefill_tokens + min(num_decoders, max_rows))
        lane_limit = 1
        if operation == Operation.SPECULATIVE:
            count = min(num_decoders, max_rows)
            draft.variant = self.caps.select(operation, count, count)
            require(draft.variant is not None, "no speculative program holds the decode cohort")
            lane_limit = draft.variant.lane_limit
            if draft.variant.length_source == LengthSource.PREFIX_LIMIT and not _drafts_drawn(lanes):
                max_tokens = count * lane_limit
            else:  # exact lengths (or ceilings granted whole, `_drafts_drawn`): the lanes' tokens must fit
                max_tokens = draft.variant.packed_token_capacity  # the program's P (below B x W with --packed-per-lane)
        for req, ahead, kind in lanes:
            if len(draft.rows) >= max_rows:
                break
            if kind not in takes or req.status != RequestStatus.RUNNING:
                continue
            if kind == DECODE:
                num_decoders -= 1
                want = min(1 if req.spec.single_lane else lane_limit, req.num_output_budget)
            else:
                want = self.cache.until_boundary(req, req.frontier, ahead)
            # one token for each later decoding lane that can still get a row: a program narrower
            # than the lanes leaves the others for a later step, and reserving for them would skip
            # the lanes first in scheduling order
            reserved = min(num_decoders, max_rows - len(draft.rows) - 1)
            room = max_tokens - draft.num_tokens - reserved
            if room > 0:
                self._schedule_lane(draft, req, min(want, room))
        if operation in (Operation.PREFILL, Operation.MIXED, Operation.SCORED_PREFILL) and not draft.preempted:
            self._admit(draft, max_rows, max_tokens)

    def _schedule_lane(self, draft: Draft, req: RequestState, tokens: int) -> None:
        if self.cache.grow(req, req.frontier + tokens) is None:
            if draft.operation == Operation.SPECULATIVE:
                tokens = 1  # a narrower lane before anyone is preempted for it
            if not self._reserve(draft, req, req.frontier + tokens):
                return
        self._add_row(draft, req, tokens)

    def _admit(self, draft: Draft, max_rows: int, max_tokens: int) -> None:
        scored = draft.operation == Operation.SCORED_PREFILL
        waiting = self.queues.waiting
        while waiting and len(draft.rows) < max_rows and draft.num_tokens < max_tokens:
            req = waiting[0]
            if is_scoring(req) != scored or self.cache.is_waiting_for_source(req):
                return
            acquired = self.slots.acquire(req.request_id)
            if acquired is None:
                return
            req.slot, req.generation = acquired
            admitted = self.cache.admit(req, max_tokens - draft.num_tokens)
            if admitted is None:
                self.slots.release(req.slot)
                req.slot = -1
                return
            tokens, work = admitted
            draft.add_work(work)
            self.queues.start(req)
            self._add_row(draft, req, tokens)

    # -- pages and preemption ------------------------------------------------------------------

    def _reserve(self, draft: Draft, req: RequestState, num_tokens: int) -> bool:
        """Grow `req` to `num_tokens` positions, reclaiming or preempting; False if it must wait."""
        while self.cache.grow(req, num_tokens) is None:
            missing = self.cache.shortfall(req, num_tokens)
            if draft.reclaiming >= missing:
                return False
            victim = max((r for r in self.queues.running if r.request_id not in draft.scheduled),
                         key=lambda r: r.order_key)
            self._preempt(draft, victim)
            if victim is req:
                return False
        return True

    def _preempt(self, draft: Draft, victim: RequestState) -> None:
        require(victim.num_inflight_plans == 0, "preempting a request with a plan in flight")
        draft.preempted = True
        self.num_preemptions += 1
        victim.num_preemptions += 1
        work = None
        if self.policy.preemption == PreemptionMode.OFFLOAD:
            covered = -(-victim.num_computed_tokens // self.cache.layout.page_tokens)
            work = self.cache.checkpoint(victim, Residence.HOST)
            if work is not None:
                draft.add_work(work)
                draft.reclaiming += covered
        if work is None:
            self.cache.release(victim)
        victim.num_computed_tokens = 0
        self.slots.release(victim.slot)
        victim.slot = -1
        self.queues.leave(victim)
        self.queues.enqueue(victim)

    def _offload_published(self, draft: Draft) -> None:
        watermark = self.policy.offload_watermark_pages
        if not watermark or self.cache.pool.num_available >= watermark:
            return
        snapshot = self.cache.snapshots.offload_candidate()
        if snapshot is None:
            return
        num_pages = len(snapshot.page_ids)
        copies = self.cache.snapshots.offload(snapshot)
        if copies is not None:
            draft.add_work(CopyWork(tuple(copies), ((snapshot.snapshot_id, FenceKind.OFFLOAD),)))
            draft.reclaiming += num_pages

    # -- rows ----------------------------------------------------------------------------------

    def _add_row(self, draft: Draft, req: RequestState, tokens: int) -> None:
        start = req.num_computed_tokens + req.num_inflight_tokens
        if start == req.num_prompt_tokens and not req.prompt_checkpointed:
            self._checkpoint_prompt(draft, req)
        elif start and start == req.stable_boundary:
            self._checkpoint_prompt(draft, req, start)
        known = len(req.token_ids)
        speculative = draft.operation == Operation.SPECULATIVE
        samples = start + tokens >= known + req.num_pending_samples
        fed = tuple(req.token_ids[start:start + (1 if speculative else tokens)])
        first = req.num_uploaded_pages
        page_ids = req.page_ids
        new_pages = tuple(page_ids[first:]) if first < len(page_ids) else ()
        req.num_uploaded_pages = len(page_ids)
        sample_index = known - req.num_prompt_tokens + req.num_pending_samples
        ceiling = (tokens if speculative else 1) if samples else 0
        draft.rows.append(PlanRow(
            req.request_id, req.slot, req.generation, fed, False, start, tokens, first,
            new_pages, samples, sample_index, ceiling, first == 0, req.spec.constrained, tuple(req.window_ids[first:])))
        req.num_inflight_tokens += tokens
        req.num_pending_samples += samples
        draft.requests.append(req)
        draft.scheduled.add(req.request_id)
        draft.num_tokens += tokens

    def _checkpoint_prompt(self, draft: Draft, req: RequestState, stable_end: int | None = None) -> None:
        """Snapshot the state at the prompt boundary (or at the end of its stable prefix, which the
        rows before were cut to reach): this plan's copies run before its program, after every plan
        launched before it, so they see exactly the state there."""
        if stable_end is None:
            req.prompt_checkpointed = True
        else:
            req.stable_checkpointed = True
        work = self.cache.checkpoint_prompt(req, stable_end)
        if work is not None:
            draft.add_work(work)

    def _finalize(self, draft: Draft) -> None:
        """Pick the smallest program of the step's operation that holds its rows and tokens."""
        if draft.operation == Operation.SPECULATIVE:
            return
        num_rows = len(draft.rows)
        plain = all(row.query_len == 1 and row.samples for row in draft.rows)
        if plain and draft.operation != Operation.SCORED_PREFILL:
            variant = self.caps.select(Operation.DECODE, num_rows, draft.num_tokens)
            if variant is not None and (variant.admits_slots or not any(row.admits for row in draft.rows)):
                draft.operation, draft.variant = Operation.DECODE, variant
                return
        if draft.operation == Operation.PREFILL and self._resumes(draft):
            variant = self.caps.select(Operation.RESUME, num_rows, draft.num_tokens)
            if variant is not None:
                draft.operation, draft.variant = Operation.RESUME, variant
                return
        variant = self.caps.select(draft.operation, num_rows, draft.num_tokens)
        require(variant is not None, f"no {draft.operation.name} program holds {num_rows} rows")
        draft.variant = variant

    @staticmethod
    def _resumes(draft: Draft) -> bool:
        """Whether a lane of the step resumes (its slot generation's first row starts past 0) and
        every lane can run in a RESUME program (no images, no log-probabilities)."""
        if not any(row.admits and row.start_pos > 0 for row in draft.rows):
            return False
        return all(req.spec.images is None and req.spec.top_logprobs is None for req in draft.requests)

    # -- second frame --------------------------------------------------------------------------

    def build_second(self, operation: Operation, variant: ProgramVariant | None,
                     requests: list[RequestState], has_copies: bool) -> Draft | None:
        """A decode round behind the in-flight one, fed by its device-owned pending tokens. Only
        where a fresh step would also decode plainly (a speculative core speculates instead) and
        the program chosen for the cohort reads device-owned pending tokens too."""
        if (not self.policy.two_frames or operation != Operation.DECODE or has_copies
                or variant is None or not variant.device_pending
                or self._decode_operation() is not Operation.DECODE):
            return None
        if self.queues.waiting and self.slots.num_free:
            return None  # an admission would change phase: wait for feedback
        cohort = []
        num_running = 0
        for req in requests:
            if req.status != RequestStatus.RUNNING:
                continue
            num_running += 1
            spec = req.spec
            if spec.needs_feedback:
                return None
            # num_output_budget >= 1, its properties inlined (a lane a step, 256 of them at a time)
            if spec.max_output_tokens - (len(req.token_ids) - req.num_prompt_tokens) - req.num_pending_samples >= 1:
                cohort.append(req)
        if num_running != len(self.queues.running) or not cohort:
            return None
        second = self.caps.select(Operation.DECODE, len(cohort), len(cohort))
        if second is None or not second.device_pending:
            return None
        draft = Draft(Operation.DECODE)
        if self.steady:  # the same grows and rows, lane by lane in one lean pass each
            return draft if steady_second(self.cache, cohort, second, draft) else None
        if any(self.cache.grow(req, req.frontier + 1) is None for req in cohort):
            return None
        for req in cohort:
            first = req.num_uploaded_pages
            new_pages = tuple(req.page_ids[first:])
            req.num_uploaded_pages = len(req.page_ids)
            draft.rows.append(PlanRow(
                req.request_id, req.slot, req.generation, (), True, req.frontier, 1, first, new_pages,
                True, req.num_output_tokens + req.num_pending_samples, 1, False, False, tuple(req.window_ids[first:])))
            req.num_inflight_tokens += 1
            req.num_pending_samples += 1
            draft.requests.append(req)
        draft.num_tokens = len(cohort)
        draft.variant = second
        return draft

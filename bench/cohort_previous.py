"""The host bodies `bench/cohort_host_ab.py` swaps (not a test): the previous ones, copied here as
they were before the decode cohort levers (methods as functions of `self`), and the current ones.
Each entry is (owner, attribute): value, where owner is a module, a class, or a function of the
engine that returns the object to set it on.

The levers, each exact (the same plans, packed values, results, events and errors):

- `steady`: the steady step's lanes checked in one pass, grown only where they need pages, its rows
  built from their field values, and a second frame's decode round the same way
  (`helios.runtime.scheduling.steady`);
- `plain completion`: `Scheduler.complete` applies a plain decode completion in one lean pass, and
  skips the final release pass when every request was running; one pass over a launched plan's
  requests (`Scheduler._launch`);
- `packing`: row columns in one pass, the rows key through one itemgetter and interned across
  steps, host page-table entries through one numpy view, per-slot values other than page tables
  visited for admitting rows only (`helios.runtime.execution.packer`, `row_sources`, `kept_values`);
- `results`: the executor's one-pass check compares each record row as one list and builds the
  results from their field values (`helios.runtime.execution.decode_results`);
- `events`: a token event counted and delivered in one call (`Engine._dispatch`, `Outbox`).
"""

from __future__ import annotations

import types

from helios.abi.completion import NO_DRAFT_CURSOR, NUM_FIELDS, RESERVED_VALUE
from helios.runtime.engine import Engine
from helios.runtime.execution import executor as executor_module
from helios.runtime.execution import decode_results
from helios.runtime.execution.image_packing import IMAGE_SOURCES, fill_image
from helios.runtime.execution.masks import write_masks
from helios.runtime.execution.pack_values import eos_row, fill_copied, is_prompt_row, write_vector
from helios.runtime.execution.packed_tokens import write_packed
from helios.runtime.execution.packer import _COPIED_SOURCES, _ROW_INDEXING, S, Packer
from helios.runtime.execution.row_sources import ROW_SOURCES, fill_admission, packed_values
from helios.runtime.records.capacities import Operation, ProgramVariant
from helios.runtime.records.events import FinishEvent, PromptScoresEvent
from helios.runtime.records.faults import require
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan
from helios.runtime.records.request import RequestState, RequestStatus
from helios.runtime.scheduling import steady, steps
from helios.runtime.scheduling.scheduler import Flight, Scheduler
from helios.runtime.scheduling.steps import Draft, StepBuilder

# -- steady: helios.runtime.scheduling.steady before the levers ----------------------------------


def previous_steady_decode(builder: StepBuilder, draft: Draft) -> bool:
    """Fills the empty DECODE `draft` with the step `builder.build` would compose for a steady
    decode cohort (see the module docstring); False (the draft left empty) when the general
    composition must run."""
    queues, cache = builder.queues, builder.cache
    running = queues.running
    count = len(running)
    if not count or builder.last_operation is not Operation.DECODE or (queues.waiting and builder.slots.num_free):
        return False
    watermark = builder.policy.offload_watermark_pages
    if watermark and cache.pool.num_available < watermark:
        return False
    max_rows, max_tokens = builder.caps.limits(Operation.DECODE)
    if count > min(max_rows, max_tokens) or builder._decode_operation() is not Operation.DECODE:
        return False
    variant = builder.caps.select(Operation.DECODE, count, count)
    if variant is None:
        return False
    missing = 0  # pages the lanes' growth takes
    pages_for = cache.layout.pages_for
    for req in running:
        if not _steady_lane(req):
            return False
        missing += max(0, pages_for(req.num_computed_tokens + req.num_inflight_tokens + 1) - len(req.page_ids))
    if missing and (missing > cache.pool.num_available
                    or (cache.window is not None and missing > cache.window.pool.num_available)):
        return False  # a lane may have to wait or preempt: the general path reserves
    for req in running:  # each succeeds from free and parked pages, as the general path's grows
        require(cache.grow(req, req.num_computed_tokens + req.num_inflight_tokens + 1) is not None,
                "a steady lane's pages did not grow")
    draft.variant = variant
    rows, requests, scheduled = draft.rows, draft.requests, draft.scheduled
    for req in running:
        rows.append(_decode_row(req))
        requests.append(req)
        scheduled.add(req.request_id)
    draft.num_tokens = count
    return True


def _steady_lane(req: RequestState) -> bool:
    """Whether a running request's next row is one plain decode position with nothing else to do:
    only its pending token ahead, output budget left, its slot generation's pages uploaded
    before, and no prompt checkpoint due (`StepBuilder._add_row`)."""
    start = req.num_computed_tokens + req.num_inflight_tokens
    known, pending, spec = len(req.token_ids), req.num_pending_samples, req.spec
    if known + pending - start != 1 or spec.score_prompt or not req.num_uploaded_pages:
        return False
    if spec.max_output_tokens - (known - req.num_prompt_tokens) - pending < 1:  # num_output_budget
        return False
    if start > req.num_prompt_tokens:  # past the prompt: no checkpoint is due
        return True
    if start == req.num_prompt_tokens and not req.prompt_checkpointed:
        return False
    return not (start and start == req.stable_boundary)


def _decode_row(req: RequestState) -> PlanRow:
    """`StepBuilder._add_row(draft, req, 1)`'s row and request updates for a steady lane (one
    token, sampling, no checkpoint, no admission), without the general case's branches."""
    start = req.num_computed_tokens + req.num_inflight_tokens
    token_ids, page_ids, window_ids = req.token_ids, req.page_ids, req.window_ids
    first, pending = req.num_uploaded_pages, req.num_pending_samples
    req.num_uploaded_pages = len(page_ids)
    req.num_inflight_tokens += 1
    req.num_pending_samples = pending + 1
    return PlanRow(req.request_id, req.slot, req.generation, tuple(token_ids[start:start + 1]), False, start, 1, first,
                   tuple(page_ids[first:]) if first < len(page_ids) else (), True,
                   len(token_ids) - req.num_prompt_tokens + pending, 1, False, req.spec.constrained,
                   tuple(window_ids[first:]) if first < len(window_ids) else ())



# -- steady: StepBuilder.build_second before the levers (a second frame's decode round) ------------


def previous_build_second(self, operation: Operation, variant: ProgramVariant | None,
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
        if req.spec.needs_feedback:
            return None
        if req.num_output_budget >= 1:
            cohort.append(req)
    if num_running != len(self.queues.running) or not cohort:
        return None
    second = self.caps.select(Operation.DECODE, len(cohort), len(cohort))
    if second is None or not second.device_pending:
        return None
    if any(self.cache.grow(req, req.frontier + 1) is None for req in cohort):
        return None
    draft = Draft(Operation.DECODE)
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


# -- plain completion: Scheduler._launch before the levers ----------------------------------------


def previous_launch(self, draft: Draft) -> StepPlan:
    sequence = self._next_sequence
    self._next_sequence += 1
    admitted = []
    for req in draft.requests:
        if not req.announced:
            req.announced = True
            admitted.append(req.spec)
    finished, self._released_ids = tuple(self._released_ids), []
    plan = StepPlan(sequence, sequence % 2, draft.operation, draft.variant, tuple(draft.rows),
                    tuple(draft.copies), draft.num_tokens, tuple(admitted), finished)
    for req in draft.requests:
        req.num_inflight_plans += 1
    self._inflight.append(Flight(plan, draft.requests, draft.fences))
    constrained = sum(row.constrained for row in plan.rows)
    if constrained:
        self._constrained_max_inflight = max(self._constrained_max_inflight, len(self._inflight))
    return plan


# -- packing: Packer.pack, _fill_bindings and _fill, and rows_key_of before the levers -----------


def previous_rows_key_of(rows) -> tuple:
    return tuple([(row.request_id, row.slot, row.generation, row.query_len, row.samples) for row in rows])


def previous_pack(self, graph: str, plan: StepPlan, submission: int | None = None) -> None:
    """Fills every binding of `graph` for `plan` (`apply` it first); `plan.masks` holds its
    constrained rows' grammar masks. `submission`: the id the core's submission input gets
    (staged with the step's values on a device; None leaves it)."""
    requests = [self._requests[row.request_id] for row in plan.rows]
    self._staging.begin(plan.frame, plan.sequence)
    # Rows with per-slot values to write (admitted, or gaining pages): none in most decode steps.
    touched = [(row, req) for row, req in zip(plan.rows, requests)
               if row.admits or row.new_page_ids or row.new_window_ids]
    for row, _ in touched:
        if row.admits and not self._initializes:
            self._reset_state(graph, row.slot)
    for binding in self._elsewhere[graph]:  # another graph's per-slot values, fixed at admission
        for row, req in touched:
            if row.admits:
                self._kept.forget(binding.buffer_name)
                fill_admission(binding, self._buffers[binding.buffer_name], row, req, self._staging)
    try:
        self._fill_bindings(graph, plan, requests, touched)
    except BaseException:  # a binding recorded as kept may not have been written (or uploaded)
        self._kept.clear()
        raise
    if submission is not None and self._submission:
        self._staging.write_value(self._submission, submission)
    self._staging.upload()


def previous_fill_bindings(self, graph: str, plan: StepPlan, requests: list, touched: list) -> None:
    """Writes `graph`'s bindings for `plan`, except those whose buffer already holds their values
    (`helios.runtime.execution.kept_values`: for a staged buffer, what its last upload left on
    the device, which a skipped binding then neither writes into this frame's mirror nor uploads).
    `touched`: the (row, request) pairs that admit a slot or gain pages."""
    copied = self._copied_for(graph, plan.rows)
    constrained = any(row.constrained for row in plan.rows)
    rows_key = previous_rows_key_of(plan.rows)
    for binding in self._bindings[graph]:
        if binding.source == S.VALUE_SOURCE_GRAMMAR_MASK and not self._staging.mask_needed(binding, constrained):
            continue
        name = binding.buffer_name
        if self._staging.stages(name) and binding.indexing != S.INDEXING_SUBMISSION_ROW:
            self._kept.forget(name)  # a mirror's rows past the live ones differ by frame: kept only if padded
        elif self._kept.holds(binding, self._buffers[name], rows_key, constrained):
            continue
        target = self._staging.target(binding.buffer_name)
        if binding.source == S.VALUE_SOURCE_HOST_TABLE_ROWS:
            self._stage_rows(binding, plan)
        elif binding.source in IMAGE_SOURCES:
            fill_image(binding, target, plan.rows, self.images_of(plan.rows))
        elif binding.source in _COPIED_SOURCES:
            fill_copied(binding, target, plan.rows, copied, (plan.masks, self._allowed))
        else:
            self._fill(binding, target, plan.rows, requests, plan.masks, touched)


def previous_fill(self, binding, target, rows: Sequence[PlanRow], requests, masks, touched) -> None:
    """`touched`: the (row, request) pairs that admit a slot or gain pages (nothing to write
    for any other row of a PHYSICAL_REQUEST_ROW binding)."""
    source, indexing = binding.source, binding.indexing
    if indexing == S.INDEXING_PHYSICAL_REQUEST_ROW:
        for row, req in touched:
            fill_admission(binding, target, row, req, self._staging)
    elif source == S.VALUE_SOURCE_INACTIVE_PADDING:
        target.fill_(binding.padding)
    elif indexing == S.INDEXING_PACKED_TOKEN:
        if not write_packed(target, source, rows, binding):  # tokens, positions, flags: row by row
            values = [v for row, req in zip(rows, requests) for v in packed_values(source, row, req)]
            write_vector(target, values, binding, pad=True)
    elif source == S.VALUE_SOURCE_GRAMMAR_MASK:
        write_masks(target, rows, masks, pad=indexing == S.INDEXING_SUBMISSION_ROW, allowed=self._allowed)
    elif indexing in _ROW_INDEXING:
        if source == S.VALUE_SOURCE_CONSTANT:
            values = [binding.constant] * len(rows)
        elif source == S.VALUE_SOURCE_LIVE_STATE_ROWS:  # a slot's first state row
            values = [row.slot * self._state_rows for row in rows]
        elif source == S.VALUE_SOURCE_EOS_IDS:
            values = [eos_row(req, target, binding) for req in requests]
        else:
            value_of = ROW_SOURCES[source]
            values = [value_of(row, req) for row, req in zip(rows, requests)]
        write_vector(target, values, binding, pad=indexing == S.INDEXING_SUBMISSION_ROW)
    elif source == S.VALUE_SOURCE_LIVE_ROW_COUNT:
        target.fill_(len(rows) + binding.offset)
    elif source == S.VALUE_SOURCE_MIXED_PREFILL_ROW:
        index = next((i for i, row in enumerate(rows) if is_prompt_row(row)), None)
        target.fill_(binding.padding if index is None else index + binding.offset)
    else:  # CONSTANT (scalar)
        target.fill_(binding.constant)


# -- results: decode_results.plain_decode_results before the levers -------------------------------


def previous_plain_decode_results(rows: Sequence[PlanRow], record: torch.Tensor, submission: int, vocab_size: int,
                         draft_lag: int | None, packed_capacity: int) -> tuple[RowResult, ...] | None:
    """The rows' `RowResult`s when `record` (int64 [>= rows, >= NUM_FIELDS], on the host) is a
    valid completion of a plain decode plan whose tokens are the ABI token column; else None."""
    if not rows or len(rows) > packed_capacity or record.device.type != "cpu" or record.shape[0] < len(rows):
        return None
    results = []
    for row, fields in zip(rows, record[:len(rows), :NUM_FIELDS].tolist()):  # LAYOUT order
        slot, generation, reported, token, offered, accepted, emitted, end, cursor, reserved = fields
        if (slot != row.slot or generation != row.generation or reported != submission or row.query_len != 1
                or not row.samples or row.admits or end != row.start_pos + 1 or offered != 1 or accepted != 0
                or emitted != 1 or reserved != RESERVED_VALUE or not 0 <= token < vocab_size
                or cursor != (NO_DRAFT_CURSOR if draft_lag is None else max(end - draft_lag, 0))):
            return None
        results.append(RowResult(slot, generation, end, (token,), 1, 0, cursor))
    return tuple(results)


# -- events: Engine._dispatch before the levers --------------------------------------------------


def previous_dispatch(self, events: list[RequestEvent]) -> None:
    # Hooks register at admission only (never while events are dispatched): without any, no
    # token is fed to a grammar or a host stop.
    watching = self.feedback.watching
    active, outbox = self._active, self.outbox
    for event in events:
        request = active.get(event.request_id)
        if request is None:
            continue
        if isinstance(event, FinishEvent):
            self._finish(request, event)
            continue
        if isinstance(event, PromptScoresEvent):
            try:
                self.outbox.deliver(request.on_event, event)
            except Exception as error:  # noqa: BLE001
                self._fail_request(request, error)
            continue
        outbox.count(event)
        try:
            outbox.deliver(request.on_event, event)
            if watching and self.feedback.advance(event.request_id, event.token_ids):
                self._dispatch(self.scheduler.stop(event.request_id))
        except Exception as error:  # noqa: BLE001 - this request's hooks failed: it ends, the worker serves on
            self._fail_request(request, error)



def _scheduler(engine):
    return engine.scheduler


PREVIOUS: dict = {
    (steps, "steady_decode"): previous_steady_decode,
    (StepBuilder, "build_second"): previous_build_second,
    (_scheduler, "plain_completion"): False,
    (Scheduler, "_launch"): previous_launch,
    (Packer, "pack"): previous_pack,
    (Packer, "_fill_bindings"): previous_fill_bindings,
    (Packer, "_fill"): previous_fill,
    (executor_module, "plain_decode_results"): previous_plain_decode_results,
    (Engine, "_dispatch"): previous_dispatch,
}
CURRENT: dict = {
    (steps, "steady_decode"): steady.steady_decode,
    (StepBuilder, "build_second"): StepBuilder.build_second,
    (_scheduler, "plain_completion"): True,
    (Scheduler, "_launch"): Scheduler._launch,
    (Packer, "pack"): Packer.pack,
    (Packer, "_fill_bindings"): Packer._fill_bindings,
    (Packer, "_fill"): Packer._fill,
    (executor_module, "plain_decode_results"): decode_results.plain_decode_results,
    (Engine, "_dispatch"): Engine._dispatch,
}


def use(engine, side: dict) -> None:
    for (owner, name), value in side.items():
        setattr(owner(engine) if isinstance(owner, types.FunctionType) else owner, name, value)

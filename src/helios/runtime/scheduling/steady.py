"""The steady decode step: every running request decodes its pending token, as in the last step.

Once a cohort decodes (the last step was DECODE), nothing queued can be admitted (no waiting
request, or no free slot), no copy is pending and no offload is due, the next fresh step is
the same cohort again, one position further: the general composition (`StepBuilder.build`:
classify every lane, choose the operation, fill, finalize) would choose DECODE, take every running
request in scheduling order with one token each, grow its pages, and pick the smallest DECODE
program holding the cohort. `steady_decode` builds exactly that step directly.

It falls back (returns None, having changed nothing the general path would not change the same
way) whenever a lane is anything else: a request with more than its pending token ahead (a
prompt, recomputation after preemption), one scoring its prompt, one without output budget, one
whose slot generation has no row yet, one whose next row publishes a prompt checkpoint, a cohort
no DECODE program holds, a core that would speculate instead, or lanes whose growth takes more
pages than the pool (and the window region's pool) holds free or parked: the general path then
reserves pages, maybe preempting, and a failed grow there returns window pages in another order,
so the steady path never tries one. With enough pages every grow succeeds at once, lane after
lane in scheduling order, as the general path's do; they run before any row is added, which
changes nothing since a grow touches only its own request and the pools and rows of a steady
step add no copies.

Rows finishing, cancelled or preempted requests and new admissions change the running set or the
lanes' counters, so the next step after them takes the general path.

`steady_second` builds the grows and rows of a second execution frame's decode round the same
lean way, for the cohort `StepBuilder.build_second` chose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from helios.runtime.records.capacities import Operation
from helios.runtime.records.faults import require
from helios.runtime.records.plan import PlanRow
from helios.runtime.records.request import RequestState

if TYPE_CHECKING:
    from helios.runtime.cache.cache_manager import CacheManager
    from helios.runtime.records.capacities import ProgramVariant
    from helios.runtime.scheduling.steps import Draft, StepBuilder


def steady_decode(builder: StepBuilder, draft: Draft) -> bool:
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
    growing = _growing_lanes(running, cache.layout.pages_for)
    if growing is None:
        return False
    missing = sum(short for _, short in growing)  # pages the lanes' growth takes
    if missing and (missing > cache.pool.num_available
                    or (cache.window is not None and missing > cache.window.pool.num_available)):
        return False  # a lane may have to wait or preempt: the general path reserves
    for req, _ in growing:  # each succeeds from free and parked pages, as the general path's grows
        require(cache.grow(req, req.num_computed_tokens + req.num_inflight_tokens + 1) is not None,
                "a steady lane's pages did not grow")
    draft.variant = variant
    draft.rows.extend(_decode_rows(running))
    draft.requests.extend(running)  # (`draft.scheduled` picks preemption victims while filling: none here)
    draft.num_tokens = count
    return True


def _growing_lanes(running, pages_for) -> list[tuple[RequestState, int]] | None:
    """The lanes whose next position needs pages, with how many (a grow of any other lane changes
    nothing), in scheduling order; None when a lane is not a steady one (`_steady_lane`)."""
    growing = []
    for req in running:
        start = req.num_computed_tokens + req.num_inflight_tokens
        if not _steady_lane(req, start):
            return None
        short = pages_for(start + 1) - len(req.page_ids)
        if short > 0:
            growing.append((req, short))
    return growing


def _steady_lane(req: RequestState, start: int) -> bool:
    """Whether a running request's next row (at `start`) is one plain decode position with nothing
    else to do: only its pending token ahead, output budget left, its slot generation's pages
    uploaded before, and no prompt checkpoint due (`StepBuilder._add_row`)."""
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


def _decode_rows(running) -> list[PlanRow]:
    """`StepBuilder._add_row(draft, req, 1)`'s rows and request updates for steady lanes (one token
    each, sampling, no checkpoint, no admission), without the general case's branches; each row
    is built from its field values in `PlanRow`'s order (`tuple.__new__`: the same row, without
    the named constructor's call)."""
    rows = []
    append, new = rows.append, tuple.__new__
    for req in running:
        start = req.num_computed_tokens + req.num_inflight_tokens
        token_ids, page_ids, window_ids = req.token_ids, req.page_ids, req.window_ids
        first, pending = req.num_uploaded_pages, req.num_pending_samples
        req.num_uploaded_pages = len(page_ids)
        req.num_inflight_tokens += 1
        req.num_pending_samples = pending + 1
        append(new(PlanRow, (req.request_id, req.slot, req.generation,
                             (token_ids[start],) if start < len(token_ids) else (), False, start, 1, first,
                             tuple(page_ids[first:]) if first < len(page_ids) else (), True,
                             len(token_ids) - req.num_prompt_tokens + pending, 1, False, req.spec.constrained,
                             tuple(window_ids[first:]) if first < len(window_ids) else ())))
    return rows


def steady_second(cache: CacheManager, cohort: list[RequestState], variant: ProgramVariant, draft: Draft) -> bool:
    """`StepBuilder.build_second`'s grows and rows for its chosen `cohort` (a decode round behind
    the in-flight one, each lane's pending token on the device): grows lane by lane until one fails
    (False: the lanes grown before it keep their pages, as there), calling `grow` only for lanes
    whose next position needs pages (`grow` changes nothing for the others); then each lane's row
    from its field values, into the empty `draft`."""
    pages_for, grow = cache.layout.pages_for, cache.grow
    for req in cohort:
        end = req.num_computed_tokens + req.num_inflight_tokens + 1
        if pages_for(end) > len(req.page_ids) and grow(req, end) is None:
            return False
    rows, new = draft.rows, tuple.__new__
    for req in cohort:
        page_ids, first, pending = req.page_ids, req.num_uploaded_pages, req.num_pending_samples
        start = req.num_computed_tokens + req.num_inflight_tokens
        req.num_uploaded_pages = len(page_ids)
        rows.append(new(PlanRow, (req.request_id, req.slot, req.generation, (), True, start, 1, first,
                                  tuple(page_ids[first:]), True, len(req.token_ids) - req.num_prompt_tokens + pending,
                                  1, False, False, tuple(req.window_ids[first:]))))
        req.num_inflight_tokens += 1
        req.num_pending_samples = pending + 1
    draft.requests.extend(cohort)
    draft.num_tokens = len(cohort)
    draft.variant = variant
    return True

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
no DECODE program holds, a core that would speculate instead, or a lane whose pages cannot grow
(the general path then reserves pages, maybe preempting). Pages are grown for every lane before
any row is added: a grow touches only its own request and the pool, and rows of a steady step
add no copies, so the pool ends as the general path leaves it, lane after lane.

Rows finishing, cancelled or preempted requests and new admissions change the running set or the
lanes' counters, so the next step after them takes the general path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from helios.runtime.records.capacities import Operation

if TYPE_CHECKING:
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
    if variant is None or not all(_steady_lane(req) for req in running):
        return False
    for req in running:
        if cache.grow(req, req.num_computed_tokens + req.num_inflight_tokens + 1) is None:
            return False
    draft.variant = variant
    for req in running:
        builder._add_row(draft, req, 1)
    return True


def _steady_lane(req) -> bool:
    """Whether a running request's next row is one plain decode position with nothing else to do."""
    start = req.num_computed_tokens + req.num_inflight_tokens
    if len(req.token_ids) + req.num_pending_samples - start != 1 or req.spec.score_prompt:
        return False
    if req.num_output_budget < 1 or req.num_uploaded_pages == 0:
        return False
    if start == req.num_prompt_tokens and not req.prompt_checkpointed:
        return False
    return not (start and start == req.stable_boundary)

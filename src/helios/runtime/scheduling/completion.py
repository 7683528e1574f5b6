"""Independent validation of an executor's completion records before any lane retires.

`find_violation` is pure: it returns a description of the first rule a plan's results break, or
None. The scheduler then either applies every row or fails the whole execution (all its lanes
end with an execution error and nothing it wrote is published), so one bad record never
corrupts another request's cache state.
"""

from __future__ import annotations

from typing import Sequence

from helios.runtime.records.capacities import Operation
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan


def find_violation(plan: StepPlan, results: Sequence[RowResult], vocab_size: int) -> str | None:
    return check_completion(plan, results, vocab_size)[0]


def check_completion(plan: StepPlan, results: Sequence[RowResult], vocab_size: int) -> tuple[str | None, bool]:
    """(`find_violation`'s answer, whether every row is a plain decode row - one sampled token after
    one position - with a valid result: the scheduler then applies the rows in one lean pass)."""
    if len(results) != len(plan.rows):
        return f"plan {plan.sequence}: {len(results)} completion records for {len(plan.rows)} rows", False
    speculative = plan.operation == Operation.SPECULATIVE
    lag = plan.variant.draft_lag_tokens if plan.variant is not None else None
    if not speculative and _plain_rows_pass(plan.rows, results, vocab_size, lag):
        return None, True
    return _lane_violation(plan, results, vocab_size, speculative, lag), False


def _lane_violation(plan: StepPlan, results: Sequence[RowResult], vocab_size: int, speculative: bool,
                    lag: int | None) -> str | None:
    total_offered = 0
    for index, (row, result) in enumerate(zip(plan.rows, results)):
        problem = _row_violation(row, result, vocab_size, speculative, lag)
        if problem is not None:
            return f"plan {plan.sequence} row {index} (slot {row.slot}): {problem}"
        total_offered += result.offered_tokens if speculative else 0
    if speculative and total_offered > plan.variant.packed_token_capacity:
        return f"plan {plan.sequence}: {total_offered} offered tokens exceed P={plan.variant.packed_token_capacity}"
    return None


def _plain_rows_pass(rows: Sequence[PlanRow], results: Sequence[RowResult], vocab_size: int,
                     lag: int | None) -> bool:
    """Whether every row is a plain decode row (samples one token after one position) whose result
    breaks no rule of `_row_violation`: one pass, the usual decode step's whole check."""
    for row, result in zip(rows, results):
        tokens, end = result.token_ids, row.start_pos + 1
        if (len(tokens) != 1 or row.query_len != 1 or not row.samples or result.slot != row.slot
                or result.generation != row.generation or not 0 <= tokens[0] < vocab_size
                or result.consumed_endpoint != end
                or result.draft_cursor != (-1 if lag is None else max(end - lag, 0))):
            return False
    return True


def _row_violation(row: PlanRow, result: RowResult, vocab_size: int, speculative: bool,
                   lag: int | None) -> str | None:
    if result.slot != row.slot or result.generation != row.generation:
        return f"record for slot {result.slot} generation {result.generation}, submitted generation {row.generation}"
    emitted = len(result.token_ids)
    if any(not 0 <= token < vocab_size for token in result.token_ids):
        return f"sampled id outside [0, {vocab_size})"
    if not row.samples:
        if emitted:
            return "a non-sampling row emitted tokens"
        expected = row.start_pos + row.query_len
    elif speculative:
        problem = _speculative_violation(row, result)
        if problem is not None:
            return problem
        expected = row.start_pos + emitted
    else:
        if emitted != 1:
            return f"{emitted} tokens from a one-token row"
        expected = row.start_pos + row.query_len
    if result.consumed_endpoint != expected:
        return f"consumed endpoint {result.consumed_endpoint}, expected {expected}"
    cursor = -1 if lag is None else max(expected - lag, 0)
    if result.draft_cursor != cursor:
        return f"draft cursor {result.draft_cursor}, expected {cursor}"
    return None


def _speculative_violation(row: PlanRow, result: RowResult) -> str | None:
    offered = result.offered_tokens
    if not 1 <= offered <= row.token_ceiling:
        return f"offered {offered} tokens against a lane ceiling of {row.token_ceiling}"
    if result.accepted_drafts != len(result.token_ids) - 1 or result.accepted_drafts > offered - 1:
        return f"accepted {result.accepted_drafts} drafts with {len(result.token_ids)} tokens of {offered} offered"
    return None

"""One-pass checks of plain decode completions: the executor's (`decode_results`) gives the
lane-by-lane results for every valid record and declines every invalid one (the lane-by-lane
validation then raises its specific error); the scheduler's (`find_violation`) passes exactly the
valid decode results and names a rule for every broken one."""

from __future__ import annotations

import pytest
import torch

from helios.abi.completion import LAYOUT, NUM_FIELDS, CompletionError, CompletionExpectation, validate_completion
from helios.runtime.execution.decode_results import plain_decode_results
from helios.runtime.execution.executor import _lane
from helios.runtime.records.capacities import Operation, ProgramVariant
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan
from helios.runtime.scheduling.completion import find_violation

VOCAB = 97
SUBMISSION = 7


def rows(count: int = 5) -> tuple[PlanRow, ...]:
    return tuple(PlanRow(f"r{i}", i, 3 + i, (5 + i,), False, 20 + 3 * i, 1, 1, (), True, 4, 1, False, False)
                 for i in range(count))


def record(plan_rows, lag=None, extra_columns: int = 1) -> torch.Tensor:
    """A valid record (with a spare column and a spare row, as the completion frames have)."""
    values = []
    for index, row in enumerate(plan_rows):
        end = row.start_pos + 1
        cursor = -1 if lag is None else max(end - lag, 0)
        values.append([row.slot, row.generation, SUBMISSION, (11 * index) % VOCAB, 1, 0, 1, end, cursor, -1]
                      + [0] * extra_columns)
    values.append([0] * (NUM_FIELDS + extra_columns))
    return torch.tensor(values, dtype=torch.int64)


def lane_by_lane(plan_rows, rec, lag=None) -> tuple[RowResult, ...]:
    expected = CompletionExpectation(submission=SUBMISSION, vocab_size=VOCAB, packed_capacity=64, draft_lag=lag,
                                     lanes=tuple(_lane(row) for row in plan_rows))
    return tuple(RowResult(lane.slot, lane.generation, lane.consumed_end, (lane.token,), lane.offered, lane.accepted,
                           lane.draft_cursor) for lane in validate_completion(rec[:, :NUM_FIELDS], expected))


@pytest.mark.parametrize("lag", [None, 0, 21])
@pytest.mark.parametrize("count", [1, 5])
def test_valid_records_give_the_lane_by_lane_results(lag, count):
    plan_rows = rows(count)
    rec = record(plan_rows, lag)
    assert plain_decode_results(plan_rows, rec, SUBMISSION, VOCAB, lag, 64) == lane_by_lane(plan_rows, rec, lag)


CORRUPTIONS = {
    "slot": (LAYOUT.slot, 9), "generation": (LAYOUT.generation, 0), "submission": (LAYOUT.submission, 6),
    "token high": (LAYOUT.token, VOCAB), "token negative": (LAYOUT.token, -1), "offered": (LAYOUT.offered, 2),
    "accepted": (LAYOUT.accepted, 1), "emitted": (LAYOUT.emitted, 0), "end": (LAYOUT.consumed_end, 99),
    "cursor": (LAYOUT.draft_cursor, 0), "reserved": (LAYOUT.reserved, 0),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
@pytest.mark.parametrize("index", [0, 4])
def test_invalid_records_are_declined_and_fail_lane_by_lane(case, index):
    plan_rows = rows()
    rec = record(plan_rows)
    column, value = CORRUPTIONS[case]
    rec[index, column] = value
    assert plain_decode_results(plan_rows, rec, SUBMISSION, VOCAB, None, 64) is None
    with pytest.raises(CompletionError):
        lane_by_lane(plan_rows, rec)


def test_rows_that_are_not_plain_decode_rows_are_declined():
    plan_rows = rows()
    rec = record(plan_rows)
    for change in ({"admits": True}, {"samples": False}, {"query_len": 2}):
        changed = plan_rows[:2] + (plan_rows[2]._replace(**change),) + plan_rows[3:]
        assert plain_decode_results(changed, rec, SUBMISSION, VOCAB, None, 64) is None
    assert plain_decode_results(plan_rows, rec, SUBMISSION, VOCAB, None, 4) is None  # over the packed capacity
    assert plain_decode_results((), rec, SUBMISSION, VOCAB, None, 64) is None


RESULT_CORRUPTIONS = {
    "slot": {"slot": 9}, "generation": {"generation": 0}, "token": {"token_ids": (VOCAB,)},
    "negative": {"token_ids": (-1,)}, "two tokens": {"token_ids": (1, 2)}, "none": {"token_ids": ()},
    "endpoint": {"consumed_endpoint": 99}, "cursor": {"draft_cursor": 0},
}


@pytest.mark.parametrize("case", RESULT_CORRUPTIONS)
def test_find_violation_names_every_broken_decode_result(case):
    plan_rows = rows()
    plan = StepPlan(3, 1, Operation.DECODE, ProgramVariant("decode8", Operation.DECODE, 8, 8), plan_rows, (), 5)
    results = list(lane_by_lane(plan_rows, record(plan_rows)))
    assert find_violation(plan, results, VOCAB) is None
    results[3] = results[3]._replace(**RESULT_CORRUPTIONS[case])
    assert find_violation(plan, results, VOCAB).startswith("plan 3 row 3 (slot 3): ")

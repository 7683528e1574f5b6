"""Completion record layout, ``helios::completion_record`` and host validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.abi.completion import (
    LAYOUT, NUM_FIELDS, CompletionCountError, CompletionEndpointError, CompletionError,
    CompletionExpectation, CompletionLayoutError, CompletionOrderError, LaneExpectation, LaneKind,
    LaneOutcome, ReservedFieldError, SampledTokenError, StaleCompletionError, validate_completion)
from helios.abi.program_image import decode_program, encode_program
from helios.abi.registry import AbiArgumentError
from helios.errors import ExecutionError

VOCAB = 100


def ints(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def lanes() -> tuple[LaneExpectation, ...]:
    """Four lanes of one mixed speculative submission."""
    return (
        LaneExpectation(slot=4, generation=2, kind=LaneKind.GENERATE, consumed_start=10,
                        offer_ceiling=4),
        LaneExpectation(slot=0, generation=7, kind=LaneKind.GENERATE, consumed_start=3,
                        offer_ceiling=1, constrained=True),
        LaneExpectation(slot=9, generation=1, kind=LaneKind.PREFILL, consumed_start=0,
                        offer_ceiling=5),
        LaneExpectation(slot=2, generation=3, kind=LaneKind.FINAL_PREFILL, consumed_start=5,
                        offer_ceiling=2),
    )


def expectation(draft_lag: int | None = 2, packed_capacity: int = 12) -> CompletionExpectation:
    return CompletionExpectation(submission=41, vocab_size=VOCAB, packed_capacity=packed_capacity,
                                 draft_lag=draft_lag, lanes=lanes())


def good_record(draft_lag: int | None = 2, padding_rows: int = 1) -> torch.Tensor:
    """What a correct program writes for `lanes()`, plus padding rows of garbage."""
    record = torch.ops.helios.completion_record(
        ints(4, 0, 9, 2), ints(2, 7, 1, 3), ints(41), ints(17, 5, -1, 99),
        ints(4, 1, 5, 2), ints(2, 0, 0, 0), ints(3, 1, 0, 1), ints(13, 4, 5, 7), draft_lag)
    return torch.cat([record, torch.full((padding_rows, NUM_FIELDS), 12345)])


def corrupted(field: str, row: int, value: int, record: torch.Tensor | None = None
              ) -> torch.Tensor:
    record = (good_record() if record is None else record).clone()
    record[row, getattr(LAYOUT, field)] = value
    return record


def test_layout_indices_are_distinct_and_dense():
    indices = [value for name, value in dataclasses.asdict(LAYOUT).items() if name != "num_fields"]
    assert sorted(indices) == list(range(NUM_FIELDS))
    with pytest.raises(dataclasses.FrozenInstanceError):
        LAYOUT.slot = 3  # type: ignore[misc]


def test_op_writes_every_field_in_layout_order():
    record = good_record(padding_rows=0)
    assert record.dtype == torch.int64 and record.shape == (4, NUM_FIELDS)
    assert record[:, LAYOUT.slot].tolist() == [4, 0, 9, 2]
    assert record[:, LAYOUT.generation].tolist() == [2, 7, 1, 3]
    assert record[:, LAYOUT.submission].tolist() == [41] * 4
    assert record[:, LAYOUT.token].tolist() == [17, 5, -1, 99]
    assert record[:, LAYOUT.offered].tolist() == [4, 1, 5, 2]
    assert record[:, LAYOUT.accepted].tolist() == [2, 0, 0, 0]
    assert record[:, LAYOUT.emitted].tolist() == [3, 1, 0, 1]
    assert record[:, LAYOUT.consumed_end].tolist() == [13, 4, 5, 7]
    assert record[:, LAYOUT.draft_cursor].tolist() == [11, 2, 3, 5]
    assert record[:, LAYOUT.reserved].tolist() == [-1] * 4


def test_draft_cursor_is_clamped_at_zero_or_absent():
    record = torch.ops.helios.completion_record(
        ints(1, 2), ints(0, 0), ints(0).reshape(()), ints(1, 1), ints(1, 1), ints(0, 0),
        ints(1, 1), ints(1, 9), 4)
    assert record[:, LAYOUT.draft_cursor].tolist() == [0, 5]
    assert good_record(None)[:4, LAYOUT.draft_cursor].tolist() == [-1] * 4


def test_valid_record_gives_one_result_per_lane():
    results = validate_completion(good_record(), expectation())
    assert [r.slot for r in results] == [4, 0, 9, 2]
    assert [r.token for r in results] == [17, 5, -1, 99]
    assert [r.consumed_end for r in results] == [13, 4, 5, 7]
    assert [r.outcome for r in results] == [LaneOutcome.OK] * 4
    assert results[0].accepted == 2 and results[0].emitted == 3 and results[0].draft_cursor == 11
    assert len(validate_completion(good_record(None), expectation(None))) == 4


def test_constrained_lane_without_allowed_token_is_an_outcome_not_an_error():
    results = validate_completion(corrupted("token", 1, -1), expectation())
    assert results[1].outcome is LaneOutcome.NO_ALLOWED_TOKEN and results[1].token == -1
    with pytest.raises(SampledTokenError) as raised:
        validate_completion(corrupted("token", 0, -1), expectation())
    assert raised.value.row == 0 and raised.value.field == "token"


@pytest.mark.parametrize("field,row,value,error", [
    ("slot", 1, 9, CompletionOrderError),
    ("generation", 0, 1, StaleCompletionError),
    ("submission", 3, 40, StaleCompletionError),
    ("reserved", 2, 0, ReservedFieldError),
    ("offered", 0, 5, CompletionCountError),  # above the lane ceiling 4
    ("offered", 0, 0, CompletionCountError),
    ("offered", 2, 4, CompletionCountError),  # prefill must consume what was submitted
    ("accepted", 0, 4, CompletionCountError),  # 3 drafts offered
    ("accepted", 0, -1, CompletionCountError),
    ("accepted", 2, 1, CompletionCountError),  # prefill has no drafts
    ("emitted", 0, 2, CompletionCountError),  # must be accepted + 1
    ("emitted", 2, 1, CompletionCountError),  # non-final prefill emits nothing
    ("emitted", 3, 0, CompletionCountError),  # final prefill emits the first token
    ("consumed_end", 0, 14, CompletionEndpointError),
    ("consumed_end", 2, 4, CompletionEndpointError),
    ("draft_cursor", 0, 10, CompletionEndpointError),
    ("draft_cursor", 1, -1, CompletionEndpointError),
    ("token", 0, VOCAB, SampledTokenError),
    ("token", 3, -5, SampledTokenError),
    ("token", 2, 0, SampledTokenError),  # nothing emitted, so no token
])
def test_each_rule_rejects_its_violation(field, row, value, error):
    with pytest.raises(error) as raised:
        validate_completion(corrupted(field, row, value), expectation())
    assert isinstance(raised.value, ExecutionError)
    assert raised.value.row == row and raised.value.field == field


def test_lane_without_draft_cursor_must_report_minus_one():
    with pytest.raises(CompletionEndpointError, match="draft_cursor"):
        validate_completion(good_record(2), expectation(None))
    with pytest.raises(CompletionEndpointError, match="draft_cursor"):
        validate_completion(good_record(None), expectation(2))


def test_aggregate_offers_must_fit_packed_capacity():
    assert validate_completion(good_record(), expectation(packed_capacity=12))
    with pytest.raises(CompletionCountError, match="packed capacity 11"):
        validate_completion(good_record(), expectation(packed_capacity=11))


def test_padding_rows_are_not_read_but_missing_rows_are_an_error():
    assert len(validate_completion(good_record(padding_rows=5), expectation())) == 4
    with pytest.raises(CompletionLayoutError):
        validate_completion(good_record(padding_rows=0)[:3], expectation())
    with pytest.raises(CompletionLayoutError):
        validate_completion(good_record().to(torch.int32), expectation())
    with pytest.raises(CompletionLayoutError):
        validate_completion(good_record()[:, :-1], expectation())
    assert issubclass(CompletionLayoutError, CompletionError)


def test_op_argument_errors():
    args = [ints(1), ints(0), ints(0), ints(1), ints(1), ints(0), ints(1), ints(1)]
    with pytest.raises(AbiArgumentError, match="draft_lag"):
        torch.ops.helios.completion_record(*args, -1)
    bad = list(args)
    bad[3] = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(AbiArgumentError, match="tokens must be torch.int64"):
        torch.ops.helios.completion_record(*bad, None)
    bad = list(args)
    bad[2] = ints(0, 0)
    with pytest.raises(AbiArgumentError, match="submission"):
        torch.ops.helios.completion_record(*bad, None)
    bad = list(args)
    bad[6] = ints(1, 1)
    with pytest.raises(AbiArgumentError, match=r"emitted must be torch.int64 \[1\]"):
        torch.ops.helios.completion_record(*bad, None)


class _RecordModule(torch.nn.Module):
    def forward(self, slots, generations, submission, tokens, offered, accepted, consumed_start):
        emitted = accepted + 1
        return torch.ops.helios.completion_record(
            slots, generations, submission, tokens, offered, accepted, emitted,
            consumed_start + emitted, 2)


def test_op_survives_export_save_and_load():
    inputs = (ints(4, 0), ints(2, 7), ints(41), ints(17, 5), ints(4, 1), ints(2, 0), ints(10, 3))
    program = torch.export.export(_RecordModule(), inputs, strict=False)
    loaded = decode_program(encode_program(program)).module()  # stored as a program image
    record = loaded(*inputs)
    assert torch.equal(record, _RecordModule()(*inputs))
    assert record[:, LAYOUT.draft_cursor].tolist() == [11, 2]


def _detailed(record: torch.Tensor, expected: CompletionExpectation):
    """The per-lane checks alone: the results, or the error they raise."""
    from helios.abi import completion

    rows = record[:len(expected.lanes)].tolist()
    try:
        results = [completion._validate_lane(index, row, lane, expected)
                   for index, (row, lane) in enumerate(zip(rows, expected.lanes))]
    except CompletionError as error:
        return type(error), error.row, error.field
    return results


@pytest.mark.parametrize("draft_lag", [2, None])
def test_the_one_pass_check_accepts_exactly_what_the_per_lane_checks_accept(draft_lag):
    """Random single and double corruptions of every field: the one-pass check passes a record
    exactly when every per-lane check does, with the same results; otherwise validation raises
    the per-lane checks' error (same type, row and field)."""
    from helios.abi import completion

    generator = torch.Generator().manual_seed(5)
    fields = [name for name in dataclasses.asdict(LAYOUT) if name != "num_fields"]
    expected = expectation(draft_lag)
    for trial in range(600):
        record = good_record(draft_lag).clone()
        for _ in range(1 + trial % 2):
            field = fields[int(torch.randint(len(fields), (1,), generator=generator))]
            row = int(torch.randint(4, (1,), generator=generator))
            delta = int(torch.randint(-3, 4, (1,), generator=generator))
            record[row, getattr(LAYOUT, field)] += delta
        detailed = _detailed(record, expected)
        fast = completion._passing_lanes(record[:4].tolist(), expected)
        if isinstance(detailed, list):
            assert fast == detailed
            assert validate_completion(record, expected) == detailed
        else:
            assert fast is None
            with pytest.raises(CompletionError) as raised:
                validate_completion(record, expected)
            assert (type(raised.value), raised.value.row, raised.value.field) == detailed

"""The pieces of served state copies, without a model: which plan copies a core's SNAPSHOT and
RESTORATION programs take (in order), the values a state-copy graph is packed, and continuation
rows whose state lives in the core's own state planes."""

from __future__ import annotations

import pytest
import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.execution.history_storage import HistoryStorage, Plane, UnsupportedCopyError
from helios.runtime.execution.pack_values import fill_state_copy
from helios.runtime.execution.bindings import Binding
from helios.runtime.execution.state_programs import RESTORATION, SNAPSHOT, StateCopyRow, StatePrograms, operation_of
from helios.runtime.records.plan import CopyOp, Location, StorageKind

PAGE, STATE, CONT, HOST = StorageKind.PAGE, StorageKind.STATE, StorageKind.CONTINUATION, StorageKind.HOST


def op(src, src_index, dst, dst_index, tokens=0) -> CopyOp:
    return CopyOp(Location(src, src_index), Location(dst, dst_index), tokens)


def test_only_slot_state_to_and_from_continuation_rows_runs_programs():
    assert operation_of(op(STATE, 1, CONT, 0)) == SNAPSHOT
    assert operation_of(op(CONT, 0, STATE, 2)) == RESTORATION
    for other in (op(PAGE, 1, CONT, 0, 3), op(CONT, 0, PAGE, 4, 3), op(STATE, 1, HOST, 0), op(HOST, 0, STATE, 1),
                  op(CONT, 0, HOST, 1, 3), op(PAGE, 1, HOST, 2, 4)):
        assert operation_of(other) is None  # pages, partial pages and host slots stay storage copies


def test_copies_run_in_plan_order_in_runs_of_one_kind():
    copies = [op(PAGE, 3, CONT, 0, 2), op(STATE, 0, CONT, 0), op(STATE, 1, CONT, 1), op(CONT, 2, STATE, 3),
              op(CONT, 2, PAGE, 5, 2), op(STATE, 2, CONT, 3)]
    runs = [(run.operation, list(run.copies)) for run in StatePrograms.runs(copies)]
    assert runs == [(None, copies[:1]), (SNAPSHOT, copies[1:3]), (RESTORATION, copies[3:4]), (None, copies[4:5]),
                    (SNAPSHOT, copies[5:])]
    assert list(StatePrograms.runs([])) == []


def binding(source: int, indexing: int, **values) -> Binding:
    return Binding("d", "d", source, indexing, values.get("offset", 0), values.get("padding", -1),
                   values.get("constant", 0))


ROWS = [StateCopyRow(slot=2, generation=7, state_row=4, snapshot_row=10),
        StateCopyRow(slot=0, generation=3, state_row=0, snapshot_row=14)]


@pytest.mark.parametrize("source, expected", [
    (spb.VALUE_SOURCE_SLOT, [2, 0, -1, -1]),
    (spb.VALUE_SOURCE_GENERATION, [7, 3, -1, -1]),
    (spb.VALUE_SOURCE_LIVE_STATE_ROWS, [4, 0, -1, -1]),
    (spb.VALUE_SOURCE_SNAPSHOT_DESTINATION, [10, 14, -1, -1]),
    (spb.VALUE_SOURCE_RESTORE_SOURCE, [10, 14, -1, -1]),
    (spb.VALUE_SOURCE_CONSTANT, [5, 5, -1, -1]),
])
def test_state_copy_rows_are_packed_per_submission_row(source, expected):
    target = torch.zeros(4, dtype=torch.int32)
    fill_state_copy(binding(source, spb.INDEXING_SUBMISSION_ROW, constant=5), target, ROWS)
    assert target.tolist() == expected


def test_state_copy_offsets_active_rows_counts_and_padding():
    target = torch.full((4,), 9, dtype=torch.int64)
    fill_state_copy(binding(spb.VALUE_SOURCE_SNAPSHOT_DESTINATION, spb.INDEXING_ACTIVE_ROW, offset=-10), target, ROWS)
    assert target.tolist() == [0, 4, 9, 9]  # active rows only: the tail keeps its bytes
    count = torch.zeros(1, dtype=torch.int32)
    fill_state_copy(binding(spb.VALUE_SOURCE_LIVE_ROW_COUNT, spb.INDEXING_SCALAR), count, ROWS)
    assert count.tolist() == [2]
    padding = torch.zeros(3, dtype=torch.int32)
    fill_state_copy(binding(spb.VALUE_SOURCE_INACTIVE_PADDING, spb.INDEXING_SUBMISSION_ROW, padding=-3), padding, ROWS)
    assert padding.tolist() == [-3] * 3
    constant = torch.zeros(1, dtype=torch.int32)
    fill_state_copy(binding(spb.VALUE_SOURCE_CONSTANT, spb.INDEXING_SCALAR, constant=11), constant, ROWS)
    assert constant.tolist() == [11]


SLOTS, R, SNAPSHOTS = 3, 2, 2


def resident_storage() -> tuple[HistoryStorage, torch.Tensor]:
    conv = torch.randn(2, (SLOTS + SNAPSHOTS) * R, 5)  # [layers, slot rows then snapshot rows, width]
    kv = Plane(torch.randn(2, 6, 4, 3), 1)
    return HistoryStorage([kv], [Plane(conv, 1)], R, SNAPSHOTS, 2, resident_from=SLOTS * R), conv


def test_continuation_state_rows_are_the_planes_snapshot_rows():
    store, conv = resident_storage()
    _, (slots,) = store.planes(StorageKind.STATE)
    _, (rows,) = store.planes(StorageKind.CONTINUATION)
    assert slots.tensor.shape[1] == SLOTS * R and rows.tensor.shape[1] == SNAPSHOTS * R
    store.copy(op(STATE, 1, CONT, 1))  # the runtime's copy writes the same rows a SNAPSHOT program would
    assert torch.equal(conv[:, (SLOTS + 1) * R:(SLOTS + 2) * R], conv[:, R:2 * R])
    store.copy(op(CONT, 1, HOST, 0))  # offload of a snapshot's state still goes to host slots
    _, (host,) = store.planes(StorageKind.HOST)
    assert torch.equal(host.tensor[:, :R], conv[:, R:2 * R])
    with pytest.raises(UnsupportedCopyError):
        store.copy(op(STATE, SLOTS, CONT, 0))  # slot rows end where the snapshot rows begin


def test_planes_too_small_for_their_snapshot_rows_are_refused():
    conv = torch.randn(2, SLOTS * R, 5)
    with pytest.raises(UnsupportedCopyError):
        HistoryStorage([], [Plane(conv, 1)], R, SNAPSHOTS, 0, resident_from=SLOTS * R)

"""State copies through the core's own SNAPSHOT and RESTORATION programs.

A plan's `CopyOp`s run in order before its program. For a core that declares SNAPSHOT and
RESTORATION graphs, the copies of a slot's state rows into a continuation row (the state part of a
snapshot's tail: a prompt-boundary or stable-prefix checkpoint) run its SNAPSHOT program, and the
copies back into a slot's state rows (a restore) run its RESTORATION program; every other copy
(pages, partial pages, host slots) stays a copy of the declared storage
(`helios.runtime.execution.history_storage`). Consecutive copies of one kind run as one
submission of the smallest variant holding them (in chunks of the largest), so the order of the
plan's copies is kept.

The snapshot rows are the core's: its state planes hold the slots' rows, then the snapshot rows
(`LoadedModel.num_slot_state_rows` is the first). A copy row binds (`Packer.pack_state_copies`):
SLOT and GENERATION of the slot whose rows are copied (the generation of the request whose state
they are: a snapshot's, the slot's owner when earlier plans computed that state, which may have
been released since - its final snapshot runs in the plan that hands the slot on; a restore's, the
slot's new owner, whose admitting row is in the same plan, as is a snapshot's that follows a restore
into the slot in that plan), LIVE_STATE_ROWS its first state row,
SNAPSHOT_DESTINATION / RESTORE_SOURCE the snapshot row's first state row, LIVE_ROW_COUNT the copies
in the submission, CONSTANT and INACTIVE_PADDING (what `helios.contract.servable` serves to them).

Thread ownership: the model worker's (the executor calls it inside `launch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.loading.model import LoadedModel, LoadedProgram, program_arguments
from helios.runtime.records.plan import CopyOp, StepPlan, StorageKind

SNAPSHOT, RESTORATION = spb.GRAPH_OPERATION_SNAPSHOT, spb.GRAPH_OPERATION_RESTORATION


class StateCopyRow(NamedTuple):
    """One state copy: the slot (and its generation) whose rows are copied, the slot's first state
    row and the snapshot row's first state row."""

    slot: int
    generation: int
    state_row: int
    snapshot_row: int


@dataclass(frozen=True)
class StateCopyRun:
    """What `StatePrograms.runs` yields: copies to run through `operation`'s program (None: plain
    storage copies, in order)."""

    operation: int | None
    copies: tuple[CopyOp, ...]


def operation_of(copy: CopyOp) -> int | None:
    """SNAPSHOT for slot state rows into a continuation row, RESTORATION for the way back, else None."""
    kinds = (copy.src.kind, copy.dst.kind)
    if kinds == (StorageKind.STATE, StorageKind.CONTINUATION):
        return SNAPSHOT
    if kinds == (StorageKind.CONTINUATION, StorageKind.STATE):
        return RESTORATION
    return None


class StatePrograms:
    """The loaded SNAPSHOT and RESTORATION programs of one model and how to run them."""

    def __init__(self, model: LoadedModel, packer, call: Callable[[LoadedProgram, list], object]):
        """`call(program, arguments)` runs one program (eagerly, or by replaying its CUDA graph)."""
        self._packer = packer
        self._call = call
        self._rows_per_request = model.state_rows_per_request
        self._first_snapshot_row = model.num_slot_state_rows
        self._device = model.device
        self._programs = {
            operation: tuple((p, program_arguments(p, model.weights, model.buffers))
                             for p in model.state_copy_programs if p.operation == operation)
            for operation in (SNAPSHOT, RESTORATION)
        }
        # slot -> the generation of its latest admitting row in the plans launched so far (`observe`)
        self._generations: dict[int, int] = {}
        # (plan sequence, the slots its copies restored so far): a snapshot after such a restore copies
        # the state of the request the plan admits (`_row`)
        self._restored: tuple[int, set[int]] = (-1, set())

    @classmethod
    def of(cls, model: LoadedModel, packer, call) -> StatePrograms | None:
        """The model's state programs, or None when it declares none."""
        return cls(model, packer, call) if model.state_copy_programs else None

    @staticmethod
    def runs(copies: Sequence[CopyOp]) -> Iterator[StateCopyRun]:
        """`copies` cut into consecutive runs of one kind, in order."""
        start = 0
        for index in range(1, len(copies) + 1):
            if index == len(copies) or operation_of(copies[index]) != operation_of(copies[start]):
                yield StateCopyRun(operation_of(copies[start]), tuple(copies[start:index]))
                start = index

    def observe(self, plan: StepPlan) -> None:
        """Records the slot generations `plan`'s rows admit; called for every plan, after its copies
        ran (they read the state of the slots' previous owners)."""
        for row in plan.rows:
            if row.admits:
                self._generations[row.slot] = row.generation

    def run(self, plan: StepPlan, operation: int, copies: Sequence[CopyOp]) -> int:
        """Runs `copies` (all of `operation`) through its programs, in chunks of the largest variant;
        returns the launches. On CUDA the host waits after each launch: every chunk's pack, and then
        the plan's own, writes the same staging mirrors, whose asynchronous upload must have read
        them first (a chunk packed while the one before was still queued gave both its rows)."""
        rows = [self._row(plan, copy, operation) for copy in copies]
        if operation == RESTORATION:
            if self._restored[0] != plan.sequence:
                self._restored = (plan.sequence, set())
            self._restored[1].update(row.slot for row in rows)
        programs = self._programs[operation]
        largest = programs[-1][0].batch_capacity
        launches = 0
        for start in range(0, len(rows), largest):
            chunk = rows[start:start + largest]
            program, arguments = next((p, a) for p, a in programs if p.batch_capacity >= len(chunk))
            self._packer.pack_state_copies(program.graph, plan, chunk)
            with torch.inference_mode():
                self._call(program, arguments)
            launches += 1
            if self._device.type == "cuda":
                torch.cuda.current_stream(self._device).synchronize()
        return launches

    def _row(self, plan: StepPlan, copy: CopyOp, operation: int) -> StateCopyRow:
        slot_end, snapshot_end = (copy.src, copy.dst) if operation == SNAPSHOT else (copy.dst, copy.src)
        r = self._rows_per_request
        # A snapshot copies state that earlier plans computed: the generation they ran the slot
        # under, not that of a request this plan admits into the slot (the snapshot's request may
        # have ended). A restore writes the state of the request this plan admits into the slot; a
        # snapshot after it in the same plan (that request's prompt-boundary or stable-prefix
        # checkpoint, taken right at the restored endpoint) copies that request's state.
        generation = self._generations.get(slot_end.index, 0)
        restored = self._restored[0] == plan.sequence and slot_end.index in self._restored[1]
        if operation == RESTORATION or restored:
            generation = next((row.generation for row in plan.rows if row.slot == slot_end.index), generation)
        return StateCopyRow(slot_end.index, generation, slot_end.index * r,
                            self._first_snapshot_row + snapshot_end.index * r)

"""Execution: runs one `StepPlan` on the loaded programs and validates its completion record.

For a plan the executor performs its cache copies, packs the program's bindings (`Packer`),
writes the transport's submission sequence, calls the selected program with its weight list and
input buffers (each narrowed to the program's static extents), copies the completion record into
the plan's frame of the completion buffer, and validates it (`helios.abi.completion`) before
turning it into the scheduler's `RowResult`s. A record that fails validation raises a
`CompletionError` (an `ExecutionError`); the caller fails the plan.

Thread ownership: the model worker only. Buffers stay alive through execution drain because the
`LoadedModel` owns them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from helios.abi.completion import (
    CompletionExpectation,
    LaneExpectation,
    LaneKind,
    LaneOutcome,
    validate_completion,
)
from helios.contract import serving_pb2 as spb
from helios.errors import ExecutionError
from helios.runtime.capacities import Operation
from helios.runtime.model import LoadedModel, LoadedProgram
from helios.runtime.packer import Packer
from helios.runtime.plan import CopyOp, PlanRow, RowResult, StepPlan, StorageKind


class UnsupportedCopyError(ExecutionError):
    """A plan asks for a copy between storage kinds this model has no storage for."""


@dataclass(frozen=True)
class StepOutput:
    """Validated per-row results, plus the program's named outputs (read-only)."""

    results: tuple[RowResult, ...]
    outputs: Mapping[str, torch.Tensor]


class Executor:
    """Runs plans on one `LoadedModel` (rank 0)."""

    def __init__(self, model: LoadedModel, packer: Packer, programs: Mapping[str, LoadedProgram],
                 host_pages: int = 0):
        self.model = model
        self.packer = packer
        self._programs = programs  # variant name -> program
        manifest = model.prepared.manifest
        self._completion = model.buffers[manifest.completion.buffer]
        self._submission = model.buffers.get(manifest.completion.submission_input)
        self._weights = {p.graph: [model.weights[name] for name in p.weights] for p in model.programs}
        self._cache_planes = [
            model.buffers[plane] for region in model.prepared.contract.model.cache.regions for plane in region.planes
        ]
        # Host slots for offloaded snapshot pages: one page of every plane per slot, in host memory.
        self._host_planes = [
            torch.zeros((plane.shape[0], host_pages, *plane.shape[2:]), dtype=plane.dtype) for plane in self._cache_planes
        ]
        self._vocab = model.prepared.sampled_range[1]

    def run(self, plan: StepPlan, masks: Mapping[str, torch.Tensor] | None = None) -> StepOutput:
        for copy in plan.copies:
            self._copy(copy)
        if plan.variant is None:
            return StepOutput((), {})
        program = self._programs[plan.variant.name]
        self.packer.pack(program.graph, plan, masks)
        if self._submission is not None:
            self._submission.fill_(plan.sequence)
        args = [self._weights[program.graph]] + [
            _narrow(self.model.buffers[name], shape) for name, shape in zip(program.inputs, program.input_shapes)
        ]
        with torch.inference_mode():
            returned = program.module(*args)
        outputs = dict(zip(program.outputs, returned if isinstance(returned, (tuple, list)) else (returned,)))
        record = outputs[self.model.prepared.manifest.completion.buffer]
        frame = self._completion[plan.frame].view(torch.int64).view(self._completion.shape[1], -1)
        frame[: record.shape[0]].copy_(record)
        return StepOutput(self._results(plan, frame[: len(plan.rows)]), outputs)

    def _results(self, plan: StepPlan, record: torch.Tensor) -> tuple[RowResult, ...]:
        expected = CompletionExpectation(
            submission=plan.sequence if self._submission is not None else 0, vocab_size=self._vocab,
            packed_capacity=plan.variant.packed_token_capacity, draft_lag=None,
            lanes=tuple(_lane(row) for row in plan.rows),
        )
        lanes = validate_completion(record, expected)
        results = []
        for lane in lanes:
            tokens = (lane.token,) if lane.emitted and lane.outcome is LaneOutcome.OK else ()
            results.append(RowResult(lane.slot, lane.generation, lane.consumed_end, tokens, lane.offered,
                                     lane.accepted, lane.draft_cursor))
        return tuple(results)

    def _copy(self, copy: CopyOp) -> None:
        """Copies the first `num_tokens` of one page between device pages and host slots, every plane."""
        storage = {StorageKind.PAGE: self._cache_planes, StorageKind.HOST: self._host_planes}
        if copy.src.kind not in storage or copy.dst.kind not in storage:
            raise UnsupportedCopyError(f"copy {copy.src.kind.name} -> {copy.dst.kind.name} has no storage here")
        tokens = copy.num_tokens
        for source, target in zip(storage[copy.src.kind], storage[copy.dst.kind]):  # [layers, pages, page_tokens, ...]
            target[:, copy.dst.index, :tokens].copy_(source[:, copy.src.index, :tokens])


def _lane(row: PlanRow) -> LaneExpectation:
    if not row.samples:
        kind = LaneKind.PREFILL
    elif row.query_len > 1 or row.admits:
        kind = LaneKind.FINAL_PREFILL
    else:
        kind = LaneKind.GENERATE
    return LaneExpectation(row.slot, row.generation, kind, row.start_pos, row.query_len, row.constrained)


def _narrow(buffer: torch.Tensor, shape: tuple[int | None, ...]) -> torch.Tensor:
    view = buffer
    for dim, extent in enumerate(shape):
        if extent is not None and view.shape[dim] != extent:
            view = view.narrow(dim, 0, extent)
    return view


def program_table(model: LoadedModel) -> dict[str, LoadedProgram]:
    """Variant name (as the scheduler's `ProgramVariant.name`) -> program."""
    return {variant_name(p): p for p in model.programs}


def variant_name(program: LoadedProgram) -> str:
    return f"{program.graph}.r{program.batch_capacity}t{program.packed_token_capacity}"


OPERATIONS = {  # contract GraphOperation -> scheduler Operation
    spb.GRAPH_OPERATION_PREFILL: Operation.PREFILL,
    spb.GRAPH_OPERATION_DECODE: Operation.DECODE,
    spb.GRAPH_OPERATION_MIXED: Operation.MIXED,
    spb.GRAPH_OPERATION_SCORED_PREFILL: Operation.SCORED_PREFILL,
}

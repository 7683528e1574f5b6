"""Execution: runs one `StepPlan` on the loaded programs and validates its completion record.

Two one-rank implementations of `helios.runtime.execution.PlanExecutor`: `Executor` calls each
program eagerly, `GraphExecutor` replays the CUDA graphs captured at load (the greedy-only graph
for steps in which no row draws); `executor_for` picks the one that fits a loaded model.

For a plan the executor first applies it to the packer (`Packer.apply`: the plan's finished ids
and admitted request specs), then performs its cache copies, packs the program's bindings (`Packer`),
writes the transport's submission sequence, calls the selected program with its weight list and
input buffers (each narrowed to the program's static extents), copies the completion record into
the plan's frame of the completion buffer, and validates it (`helios.abi.completion`) before
turning it into the scheduler's `RowResult`s. A record that fails validation raises a
`CompletionError` (an `ExecutionError`); the caller fails the plan.

Emitted token ids come from the record's SAMPLED_TOKENS field as the manifest lays it out (the ABI
token column, or the extra columns of cores whose lanes emit several tokens; they must end with
the ABI record's last token). SPECULATIVE lanes are validated as generating lanes against their
reserved ceiling, the aggregate P and the program's draft-cursor lag; a program's proposal
confidence is copied into the plan's frame of the confidence buffer. Validated emissions are
reported to the packer (`Packer.observe`), which keeps request histories for history drafting.

Two execution frames (`launch` / `finish`): `launch` performs everything up to the program
call and queues the record's copy into the plan's frame of the host completion buffer (pinned, an
asynchronous copy on CUDA) followed by an event; `finish` waits for that event and validates. The
engine launches a second plan (a decode round fed by device-owned pending tokens) before it
finishes the first, so the host packs round N+1 while the device runs round N. The two frames use
separate completion frames and separate packer staging (`Packer.pack` stages by `plan.frame`); a
program's named outputs in `StepOutput.outputs` are its static graph outputs on CUDA, valid until
that program is launched again (read them before the next `launch`, or use `run`). `run` is
`finish(launch(plan))`.

Token log-probabilities: a plain PREFILL, DECODE, MIXED or SPECULATIVE program may have a
token-logprobs twin (same operation and capacities, `GraphContract.token_logprobs`), which also
returns each row's ``helios::token_logprobs`` values (a SPECULATIVE twin's, of each emitted token).
`launch` runs the twin instead of the planned program only when a sampling row of the plan belongs
to a request that asks for log-probabilities (steps without one pay nothing), and queues the copy of
those outputs to the host with the record's; `finish` attaches each asking row's `TokenLogprobs`
(its request's number of alternatives) to its `RowResult` (`with_token_logprobs`). SCORED_PREFILL
programs return the same values for every row they sample.

`Launched` and `StepOutput` live in `helios.runtime.execution.step_output`, variant names and
logprob twins in `helios.runtime.execution.program_variants`, the image feeder in
`helios.runtime.execution.vision_programs`.

Thread ownership: the model worker only. Buffers stay alive through execution drain because the
`LoadedModel` owns them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Sequence

import torch

from helios.abi.completion import (
    LAYOUT,
    NUM_FIELDS,
    CompletionExpectation,
    LaneCompletion,
    LaneExpectation,
    LaneKind,
    LaneOutcome,
    SampledTokenError,
    validate_completion,
)
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.views import TOKEN_LOGPROB_OUTPUTS
from helios.runtime.records.capacities import Operation
from helios.runtime.execution.decode_results import plain_decode_results
from helios.runtime.execution.history_storage import UnsupportedCopyError, model_storage  # noqa: F401 (re-exported)
from helios.runtime.execution.program_variants import is_fresh_chunk, logprob_twins, program_table, variant_name
from helios.runtime.execution.step_output import Launched, StepOutput, with_token_logprobs
from helios.runtime.execution.vision_programs import image_feeder
from helios.runtime.loading.model import LoadedModel, LoadedProgram, program_arguments
from helios.runtime.execution.packer import Packer
from helios.runtime.execution.state_programs import StatePrograms
from helios.runtime.records.plan import CopyOp, PlanRow, RowResult, StepPlan, StorageKind
from helios.runtime.loading.cuda_graphs import CaptureError, CapturedProgram


class Executor:
    """Runs plans on one `LoadedModel` (rank 0)."""

    def __init__(self, model: LoadedModel, packer: Packer, programs: Mapping[str, LoadedProgram],
                 host_pages: int = 0):
        self.model = model
        self.packer = packer
        self._programs = programs  # variant name -> program
        self._twins = logprob_twins(programs.values())  # plain variant name -> token-logprobs twin
        manifest = model.prepared.manifest
        self._completion = model.buffers[manifest.completion.buffer]
        # Each frame of the completion buffer as int64 records [rows, columns] (the buffer never moves).
        self._frames = tuple(frame.view(torch.int64).view(self._completion.shape[1], -1) for frame in self._completion)
        self._submission = model.buffers.get(manifest.completion.submission_input)
        self._arguments = {name: program_arguments(p, model.weights, model.buffers) for name, p in programs.items()}
        # Pages, slot state rows, continuation rows and host slots that plan copies move between.
        self.storage = model_storage(model, host_pages)
        self._vocab = model.prepared.sampled_range[1]
        self._token_columns = _token_columns(manifest.completion)
        self.array_results = True  # plain decode records checked in one pass (`decode_results`); False: lane by lane
        if model.settings.history_drafting:  # a startup option of the loaded model
            packer.enable_history_drafting()
        confidence = manifest.completion.confidence_buffer
        self._confidence = model.buffers.get(confidence) if confidence else None
        cuda = model.device.type == "cuda"
        self._events = [torch.cuda.Event() for _ in range(2)] if cuda else []  # one per frame
        self.images = image_feeder(model, packer, self._encode)  # None for a text-only core
        self._initializers = tuple((p, program_arguments(p, model.weights, model.buffers))
                                   for p in model.initialization_programs)  # smallest batch first
        # The core's SNAPSHOT and RESTORATION programs copy slot state rows (None: storage copies do).
        self.state_programs = StatePrograms.of(model, packer, self._encode)

    @property
    def overlaps(self) -> bool:
        """Whether `launch` returns before the device has finished (a second frame pays off)."""
        return self.model.device.type == "cuda"

    def run(self, plan: StepPlan) -> StepOutput:
        """`launch` and `finish` of one plan."""
        return self.finish(self.launch(plan, alone=True))

    def launch(self, plan: StepPlan, *, alone: bool = False) -> Launched:
        """Copies, packing and the program call of `plan`; its record is on its way to the host.
        (`alone` changes nothing here: one rank runs the same way either way.)"""
        self.packer.apply(plan)
        launches = self._copies(plan)
        if self.state_programs is not None:  # after the copies: they read the slots' previous owners
            self.state_programs.observe(plan)
        if plan.variant is None:
            return Launched(plan, None, {}, None, state_launches=launches)
        program = self._program_for(plan)
        if self.images is not None and plan.operation in (Operation.PREFILL, Operation.MIXED):
            self.images.feed(plan.rows, self.packer.images_of(plan.rows))
        # The submission id travels with the step's values (one upload on a device).
        self.packer.pack(program.graph, plan, plan.sequence if self._submission is not None else None)
        with torch.inference_mode():
            returned = self._call(program, plan)
        self.packer.index_histories()  # host work the program does not need: while the device runs
        outputs = dict(zip(program.outputs, returned if isinstance(returned, (tuple, list)) else (returned,)))
        record = outputs[self.model.prepared.manifest.completion.buffer]
        asynchronous = record.device.type == "cuda" and self._completion.is_pinned()
        self._frame(plan)[: record.shape[0], : record.shape[1]].copy_(record, non_blocking=asynchronous)
        confidence = outputs.get(self.model.prepared.manifest.completion.confidence_buffer)
        if confidence is not None and self._confidence is not None:
            target = self._confidence[plan.frame, : confidence.shape[0], : confidence.shape[1]]
            target.copy_(confidence, non_blocking=asynchronous and self._confidence.is_pinned())
        scores = None
        if program.returns_token_logprobs:
            scores = tuple(_to_host(outputs[name][: len(plan.rows)], asynchronous) for name in TOKEN_LOGPROB_OUTPUTS)
        done = None
        if record.device.type == "cuda":  # on the model's stream, whatever this thread's current device
            done = self._events[plan.frame]
            done.record(torch.cuda.current_stream(record.device))
        return Launched(plan, program, outputs, done, scores, launches)

    def _call(self, program: LoadedProgram, plan: StepPlan):
        """The program's outputs for the packed `plan`: an eager call on its fixed arguments."""
        return program.module(*self._arguments[variant_name(program)])

    def _initialize(self, plan: StepPlan) -> None:
        """Runs the core's INITIALIZATION program over the rows `plan` admits (in chunks of the
        largest variant), before the plan's own program reads their state and before its copies
        restore any (`_copies`). On CUDA the host waits after each chunk: every chunk's pack, and
        then the plan's own, writes the same staging mirrors, whose asynchronous upload must have
        read them first (a chunk packed while the one before was still queued gave both its rows;
        admission is rare)."""
        admitted = [row for row in plan.rows if row.admits]
        largest = self._initializers[-1][0].batch_capacity
        for start in range(0, len(admitted), largest):
            rows = tuple(admitted[start:start + largest])
            program, args = next((p, a) for p, a in self._initializers if p.batch_capacity >= len(rows))
            self.packer.pack(program.graph, plan._replace(rows=rows))
            with torch.inference_mode():
                self._encode(program, args)
            if self.model.device.type == "cuda":
                torch.cuda.current_stream(self.model.device).synchronize()

    def _program_for(self, plan: StepPlan) -> LoadedProgram:
        """The planned program, or its token-logprobs twin when a row asks for log-probabilities."""
        twin = self._twins.get(plan.variant.name)
        if twin is not None and self.packer.wants_logprobs(plan):
            return twin
        return self._programs[plan.variant.name]

    def finish(self, launched: Launched) -> StepOutput:
        """Waits for `launched` and validates its record (raises `CompletionError` when invalid)."""
        if launched.program is None:
            return StepOutput((), {}, launched.state_launches)
        if launched.done is not None:
            launched.done.synchronize()
        plan = launched.plan
        self.packer.retire(plan.sequence)  # the device is done with it: host staging frames may be reused
        results = self._results(plan, launched.program, self._frame(plan)[: len(plan.rows)])
        if launched.scores is not None:
            results = self._with_logprobs(plan, results, launched.scores)
        self.packer.observe(plan, results)
        return StepOutput(results, launched.outputs, launched.state_launches)

    def _with_logprobs(self, plan: StepPlan, results: tuple[RowResult, ...], scores) -> tuple[RowResult, ...]:
        """`results` with the `TokenLogprobs` of every emitted token whose request asks for them."""
        return with_token_logprobs(results, [self.packer.top_logprobs(row.request_id) for row in plan.rows], scores)

    def _frame(self, plan: StepPlan) -> torch.Tensor:
        """The plan's frame of the completion buffer as int64 records [rows, columns]."""
        return self._frames[plan.frame]

    def _results(self, plan: StepPlan, program: LoadedProgram, record: torch.Tensor) -> tuple[RowResult, ...]:
        speculative = plan.operation == Operation.SPECULATIVE
        lag = program.speculative.draft_lag if program.speculative is not None else None
        if self.array_results and not speculative and self._token_columns == (LAYOUT.token, 1):  # one pass
            results = plain_decode_results(plan.rows, record, plan.sequence if self._submission is not None else 0,
                                           self._vocab, lag, plan.variant.packed_token_capacity)
            if results is not None:
                return results
        expected = CompletionExpectation(
            submission=plan.sequence if self._submission is not None else 0, vocab_size=self._vocab,
            packed_capacity=plan.variant.packed_token_capacity,
            draft_lag=lag, lanes=tuple(_lane(row, speculative) for row in plan.rows),
        )
        lanes = validate_completion(record[:, :NUM_FIELDS], expected)
        rows = None if self._token_columns == (LAYOUT.token, 1) else record.tolist()  # None: the ABI column is all
        results = []
        for index, lane in enumerate(lanes):
            tokens = self._emitted(index, rows[index] if rows is not None else None, lane)
            results.append(RowResult(lane.slot, lane.generation, lane.consumed_end, tokens, lane.offered,
                                     lane.accepted, lane.draft_cursor))
        return tuple(results)

    def _emitted(self, index: int, row: list[int] | None, lane: LaneCompletion) -> tuple[int, ...]:
        """The lane's emitted ids from the SAMPLED_TOKENS columns (empty for NO_ALLOWED_TOKEN);
        `row` (the record row) is None when those columns are the ABI token column alone."""
        if not lane.emitted or lane.outcome is not LaneOutcome.OK:
            return ()
        first, count = self._token_columns
        if first == LAYOUT.token and count == 1 and lane.emitted == 1:  # the validated token itself
            return (lane.token,)
        if lane.emitted > count:
            raise SampledTokenError(index, "tokens", f"{lane.emitted} emitted, the record holds {count} token ids")
        tokens = tuple(row[first:first + lane.emitted])
        if tokens[-1] != lane.token or any(t != -1 for t in row[first + lane.emitted:first + count]):
            raise SampledTokenError(index, "tokens", f"emitted ids {row[first:first + count]} disagree with "
                                    f"{lane.emitted} tokens ending in {lane.token}")
        return tokens

    def _copies(self, plan: StepPlan) -> Mapping[str, int]:
        """The plan's copies, in order: slot state rows through the core's state programs when it
        has them (`helios.runtime.execution.state_programs`), everything else between storages.
        The rows the plan admits are initialized between them (by the INITIALIZATION program, or
        the packer zeroes the state the plan's program writes: `Packer.reset_admitted`): before the
        first copy into a slot's state rows (a restore into an admitted slot, whose
        state an initialization after it would clear), after the copies before it (a final
        snapshot of the slot's previous owner, which it would clear too). Returns the state
        programs launched, by operation name."""
        launches: dict[str, int] = {}
        copies = plan.copies
        first = next((i for i, copy in enumerate(copies) if copy.dst.kind == StorageKind.STATE), len(copies))
        self._run_copies(plan, copies[:first], launches)
        if self._initializers:
            self._initialize(plan)
        elif plan.variant is not None:  # the runtime's own reset of the admitted rows, at the same place
            self.packer.reset_admitted(self._program_for(plan).graph, plan)
        self._run_copies(plan, copies[first:], launches)
        return MappingProxyType(launches)

    def _run_copies(self, plan: StepPlan, copies: Sequence[CopyOp], launches: dict[str, int]) -> None:
        """`copies` of `plan`, in order, counting the state programs launched into `launches`."""
        if self.state_programs is None:
            for copy in copies:
                self._copy(copy)
            return
        for run in self.state_programs.runs(copies):
            if run.operation is None:
                for copy in run.copies:
                    self._copy(copy)
                continue
            name = spb.GraphOperation.Name(run.operation)[len("GRAPH_OPERATION_"):].lower()
            launches[name] = launches.get(name, 0) + self.state_programs.run(plan, run.operation, run.copies)

    def _copy(self, copy: CopyOp) -> None:
        """One plan copy between pages, slot state rows, continuation rows and host slots."""
        self.storage.copy(copy)

    @staticmethod
    def _encode(program: LoadedProgram, arguments: list):
        """An auxiliary program's outputs (an image encoder, an initialization program): an eager call."""
        return program.module(*arguments)


class GraphExecutor(Executor):
    """`Executor` over programs captured into CUDA graphs (`helios.runtime.loading.cuda_graphs`): each
    launch replays the program's graph, the greedy-only one when no row of the plan draws, of the
    program's fresh-chunk variant when the plan is one prompt chunk from position 0 and the program
    has one (`helios.runtime.loading.fresh_calls`)."""

    def __init__(self, model: LoadedModel, packer: Packer, programs: Mapping[str, LoadedProgram],
                 host_pages: int = 0):
        uncaptured = [name for name, p in programs.items() if not isinstance(p.module, CapturedProgram)]
        uncaptured += [p.graph for p in (*model.vision_programs, *model.initialization_programs,
                                         *model.state_copy_programs) if not isinstance(p.module, CapturedProgram)]
        if uncaptured:
            raise CaptureError(f"programs {', '.join(uncaptured)} were not captured into CUDA graphs")
        super().__init__(model, packer, programs, host_pages)

    def _call(self, program: LoadedProgram, plan: StepPlan):
        return program.module.replay(greedy=self.packer.all_greedy(plan), fresh=is_fresh_chunk(plan))

    @staticmethod
    def _encode(program: LoadedProgram, arguments: list):
        return program.module.replay(greedy=False)


def executor_for(model: LoadedModel, packer: Packer, host_pages: int = 0) -> Executor:
    """The one-rank executor of `model`: a `GraphExecutor` when its programs were captured."""
    captured = bool(model.programs) and all(isinstance(p.module, CapturedProgram) for p in model.programs)
    kind = GraphExecutor if captured else Executor
    return kind(model, packer, program_table(model), host_pages)


def _token_columns(layout: mpb.CompletionLayout) -> tuple[int, int]:
    """(first int64 column, count) of the record's SAMPLED_TOKENS field."""
    field = next(f for f in layout.fields if f.kind == mpb.COMPLETION_FIELD_KIND_SAMPLED_TOKENS)
    return field.byte_offset // 8, field.count


def _lane(row: PlanRow, speculative: bool = False) -> LaneExpectation:
    if speculative and row.samples:
        return LaneExpectation(row.slot, row.generation, LaneKind.GENERATE, row.start_pos, row.token_ceiling,
                               row.constrained)
    if not row.samples:
        kind = LaneKind.PREFILL
    elif row.query_len > 1 or row.admits:
        kind = LaneKind.FINAL_PREFILL
    else:
        kind = LaneKind.GENERATE
    return LaneExpectation(row.slot, row.generation, kind, row.start_pos, row.query_len, row.constrained)


def _to_host(tensor: torch.Tensor, asynchronous: bool) -> torch.Tensor:
    """A host copy of a program output (queued on the stream when `asynchronous`; the launch's
    event, recorded after it, says when it is complete)."""
    if tensor.device.type == "cpu":
        return tensor.clone()
    return tensor.to("cpu", non_blocking=asynchronous)

"""Host staging tables (Engram): hashed n-gram rows of a host-resident table, staged per step.

A core declares each table (`ModelContract.host_tables`): a PLACEMENT_HOST WEIGHT buffer
[rows, width] that never goes to the device, an n-gram length n and hash heads with their
multipliers. For every packed token of a step, head h selects row

    (XOR over i < n of ((token[p - i] + 1) * multipliers[h * n + i] mod 2^64)) mod rows

(a position before the first token contributes 0), so the rows a step needs are known on the host
before the program runs. `HostStaging.stage` gathers them into one of the table's two host frames
[packed tokens, heads, width] (pinned when CUDA is present; a submission uses the frame of its
execution frame, `StepPlan.frame`) and the packer copies the frame into the HOST_TABLE_ROWS destination, on
CUDA asynchronously, ordered before the program on the current stream. The copy (and so the
submission) is the frame's consumer.

Reuse rule: a frame is written again (for the next submission of its execution frame) only after
every participating rank has retired the submission that last consumed it. A rank retires a submission when its
executor has finished it (`Executor.finish`, after the device is done with the copy). One rank
checks its own retirements (`LocalRetirement`); tensor-parallel ranks check all of them with one
MIN all-reduce over their gloo group (`GroupRetirement`), which every rank runs at the same point
of the same submission, so a rank whose consumer is unretired stops every rank from overwriting
the frame. Overwriting it anyway would change another rank's inputs under its running program, so
`stage` raises `FrameInUseError` instead: the engine packs a plan of an execution frame only after
the previous plan of that frame finished, so this is an invariant, not a wait.

Thread ownership: the model worker of one rank; not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import numpy as np
import torch
import torch.distributed as dist

from helios.contract import PreparedContract
from helios.errors import ExecutionError

FRAMES = 2


class FrameInUseError(ExecutionError):
    """A host staging frame would be overwritten before every rank retired its consumer."""


@dataclass(frozen=True)
class HostTable:
    """One declared table: its name, n-gram length, multipliers [heads, n] and the host tensor."""

    name: str
    ngram_tokens: int
    multipliers: np.ndarray  # uint64 [heads, ngram_tokens]
    table: torch.Tensor  # [rows, width], host memory

    @property
    def heads(self) -> int:
        return self.multipliers.shape[0]

    def row_ids(self, context: Sequence[int], start: int, count: int) -> np.ndarray:
        """Rows [count, heads] selected for positions start .. start + count - 1 of `context` (the
        request's tokens; it holds at least start + count of them)."""
        n = self.ngram_tokens
        shifted = np.zeros(start + count + n, dtype=np.uint64)  # shifted[n + p] = token[p] + 1
        shifted[n:] = np.asarray(context[:start + count], dtype=np.int64).astype(np.uint64) + np.uint64(1)
        grams = np.stack([shifted[n + start - i:n + start + count - i] for i in range(n)], axis=1)  # [count, n]
        with np.errstate(over="ignore"):
            products = grams[:, None, :] * self.multipliers[None, :, :]  # wraps modulo 2^64
        keys = np.bitwise_xor.reduce(products, axis=2)
        return (keys % np.uint64(self.table.shape[0])).astype(np.int64)


class Retirement(Protocol):
    """Which submissions every participating rank has retired."""

    def retire(self, sequence: int) -> None: ...

    def retired_everywhere(self, sequence: int) -> bool: ...


class LocalRetirement:
    """One rank: submissions retire in submission order; the highest retired one says it all."""

    def __init__(self) -> None:
        self.retired = -1

    def retire(self, sequence: int) -> None:
        self.retired = max(self.retired, sequence)

    def retired_everywhere(self, sequence: int) -> bool:
        return self.retired >= sequence


class GroupRetirement(LocalRetirement):
    """Tensor-parallel ranks: `retired_everywhere` is a MIN all-reduce of every rank's retired
    submission over `process_group` (gloo, CPU tensors); every rank calls it at the same point."""

    def __init__(self, process_group) -> None:
        super().__init__()
        self._group = process_group

    def retired_everywhere(self, sequence: int) -> bool:
        value = torch.tensor([self.retired], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self._group)
        return int(value.item()) >= sequence


class HostStaging:
    """The two host frames of every declared table, and the rule that guards their reuse."""

    def __init__(self, tables: Mapping[str, HostTable], capacities: Mapping[str, int],
                 retirement: Retirement | None = None):
        """`capacities[name]`: packed tokens one frame of the table holds (the largest destination)."""
        self.tables = dict(tables)
        self.retirement: Retirement = retirement or LocalRetirement()
        pinned = torch.cuda.is_available()
        self._frames = {
            name: [torch.zeros((capacities[name], t.heads, t.table.shape[1]), dtype=t.table.dtype, pin_memory=pinned)
                   for _ in range(FRAMES)]
            for name, t in self.tables.items()
        }
        self._occupant = {name: [None] * FRAMES for name in self.tables}  # submission that last filled a frame

    def use_retirement(self, retirement: Retirement) -> None:
        """Switch to another retirement (a tensor-parallel group, once formed; before any submission)."""
        self.retirement = retirement

    def stage(self, name: str, frame_index: int, sequence: int,
              lanes: Sequence[tuple[Sequence[int], int, int]]) -> torch.Tensor:
        """Fills table `name`'s frame `frame_index` for submission `sequence` with the rows of
        `lanes`, each (context, start, count) in packed order, zero rows after them; returns the
        frame. Raises `FrameInUseError` while a rank has not retired the frame's previous consumer."""
        slot = frame_index % FRAMES
        previous = self._occupant[name][slot]
        if previous == sequence:  # a second destination of the same table in one submission
            return self._frames[name][slot]
        if previous is not None and not self.retirement.retired_everywhere(previous):
            raise FrameInUseError(f"host table {name!r}: frame {slot} still feeds submission {previous} on some rank; "
                                  f"submission {sequence} cannot overwrite it")
        table, frame = self.tables[name], self._frames[name][slot]
        ids = [table.row_ids(context, start, count) for context, start, count in lanes if count]
        rows = np.concatenate(ids) if ids else np.zeros((0, table.heads), dtype=np.int64)
        if rows.shape[0] > frame.shape[0]:
            raise ExecutionError(f"host table {name!r}: {rows.shape[0]} tokens exceed the frame's {frame.shape[0]}")
        count = rows.shape[0]
        if count:
            torch.index_select(table.table, 0, torch.from_numpy(rows.reshape(-1)),
                               out=frame[:count].view(count * table.heads, -1))
        frame[count:].zero_()
        self._occupant[name][slot] = sequence
        return frame

    def retire(self, sequence: int) -> None:
        """This rank has finished submission `sequence` (its consumers are done)."""
        self.retirement.retire(sequence)


def host_staging(prepared: PreparedContract, weights: Mapping[str, torch.Tensor],
                 buffers: Mapping[str, torch.Tensor]) -> HostStaging | None:
    """The staging of a core's declared host tables (None without any), each frame as large as the
    largest HOST_TABLE_ROWS destination of its table."""
    declared = prepared.contract.model.host_tables
    if not declared:
        return None
    tables = {}
    for t in declared:
        multipliers = np.array(list(t.multipliers), dtype=np.uint64).reshape(t.heads, t.ngram_tokens)
        tables[t.name] = HostTable(t.name, t.ngram_tokens, multipliers, weights[t.table])
    capacities = {name: 0 for name in tables}
    for graph in prepared.graphs.values():
        for view in graph.bindings:
            if view.host_table in capacities:
                capacities[view.host_table] = max(capacities[view.host_table], buffers[view.buffer].shape[0])
    return HostStaging(tables, capacities)

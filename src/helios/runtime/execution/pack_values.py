"""Value helpers of shared packing (`helios.runtime.execution.packer`): vectors written with offsets and
padding, EOS rows, the mixed-prefill row test, the copied-proposal sources and state-copy rows."""

from __future__ import annotations

from typing import Sequence

import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.records.plan import PlanRow

S = spb


def is_prompt_row(row: PlanRow) -> bool:
    """A lane consuming prompt (or recomputed) tokens rather than one pending token."""
    return not row.samples or row.query_len > 1 or row.sample_index == 0


def eos_row(req, target: torch.Tensor, binding) -> tuple[int, ...]:
    """The request's EOS ids (`RequestSpec.eos_ids` in ascending order, +offset: the same row on
    every rank) padded to the destination's width."""
    width = target.shape[-1] if target.dim() > 1 else 1
    if len(req.eos_ids) > width:
        raise ValueError(f"{binding.destination}: {len(req.eos_ids)} EOS ids exceed the prepared {width}")
    return tuple(t + binding.offset for t in sorted(req.eos_ids)) + (binding.padding,) * (width - len(req.eos_ids))


def fill_copied(binding, target: torch.Tensor, rows: Sequence[PlanRow], copied, masking) -> None:
    """One copied-proposal binding: `copied` holds each row's candidates, `masking` the (grammar
    masks by request, allowed row) pair."""
    if binding.source == S.VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT:
        write_vector(target, [row.start_pos for row in rows], binding, pad=True)
    elif binding.source == S.VALUE_SOURCE_COPIED_CANDIDATE_COUNT:
        write_vector(target, [len(c) for c in copied] or [0] * len(rows), binding, pad=True)
    elif binding.source == S.VALUE_SOURCE_COPIED_GENERATION:
        # The generation the candidates were copied for: the lane's own (padding without candidates).
        values = [row.generation if c else None for row, c in zip(rows, copied or [()] * len(rows))]
        write_vector(target, values, binding, pad=True)
    elif binding.source == S.VALUE_SOURCE_COPIED_GRAMMAR_MASKS:
        _fill_copied_masks(target, rows, *masking)
    else:
        width = target.shape[1]
        write_vector(target, [c + (binding.padding,) * (width - len(c)) for c in copied], binding, pad=True)


def _fill_copied_masks(target: torch.Tensor, rows: Sequence[PlanRow], masks, allowed: torch.Tensor | None) -> None:
    """[rows, positions, words]: every position of a lane allows the sampled vocabulary, except a
    constrained lane's first position, which takes its grammar mask (such a lane has no candidates,
    so no later position is used); rows past the live ones allow everything too."""
    if allowed is None:
        target.fill_(-1)
    else:
        target.copy_(allowed.to(target.dtype).expand_as(target))
    for index, row in enumerate(rows):
        mask = masks.get(row.request_id) if row.constrained else None
        if mask is not None:
            target[index, 0] = mask if allowed is None else mask & allowed


def write_vector(target: torch.Tensor, values: list, binding, pad: bool) -> None:
    """Rows (or packed tokens) 0..n-1 get values (+offset; None -> padding); the rest padding."""
    n = len(values)
    if n and isinstance(values[0], tuple):
        values = [padded(v, target, binding) for v in values]
    if n > target.shape[0]:
        raise ValueError(f"{binding.destination}: {n} values exceed the buffer's {target.shape[0]} rows")
    if n and (binding.offset != 0 or None in values):
        values = [binding.padding if v is None else _offset(v, binding.offset) for v in values]
    array = host_array(target)
    if array is not None:  # a host buffer: written in place through numpy (the same values, no tensor made)
        if n:
            array[:n] = values
        if pad and n < target.shape[0]:
            array[n:] = binding.padding
        return
    if n:
        target[:n] = torch.tensor(values, dtype=target.dtype)
    if pad and n < target.shape[0]:
        target[n:] = binding.padding


_NUMPY_DTYPES = frozenset((torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                           torch.float32, torch.float64, torch.float16))


def host_array(target: torch.Tensor):
    """A numpy view of a host tensor of a dtype numpy holds (writes through it are the tensor's),
    else None. Python ints, floats and bools convert as ``torch.tensor(values, dtype=...)`` would:
    exactly, or a float rounded to nearest; an int out of the dtype's range raises OverflowError."""
    if target.device.type != "cpu" or target.dtype not in _NUMPY_DTYPES:
        return None
    return target.numpy()


def padded(value: tuple, target: torch.Tensor, binding) -> tuple:
    """A vector value (sampling parameters) filled with padding to the destination's row width."""
    width = target.shape[-1]
    if len(value) > width:
        raise ValueError(f"{binding.destination}: {len(value)} values exceed the prepared width {width}")
    return value + (binding.padding,) * (width - len(value))


def _offset(value, offset: int):
    if isinstance(value, tuple):
        return value
    return value + offset


# A state copy's per-row values (`helios.runtime.execution.state_programs.StateCopyRow`).
_STATE_COPY_VALUES = {
    S.VALUE_SOURCE_SLOT: lambda row, binding: row.slot,
    S.VALUE_SOURCE_GENERATION: lambda row, binding: row.generation,
    S.VALUE_SOURCE_LIVE_STATE_ROWS: lambda row, binding: row.state_row,
    S.VALUE_SOURCE_SNAPSHOT_DESTINATION: lambda row, binding: row.snapshot_row,
    S.VALUE_SOURCE_RESTORE_SOURCE: lambda row, binding: row.snapshot_row,
    S.VALUE_SOURCE_CONSTANT: lambda row, binding: binding.constant,
}


def fill_state_copy(binding, target: torch.Tensor, rows: Sequence) -> None:
    """One binding of a SNAPSHOT or RESTORATION graph for its state-copy rows (only the sources
    `helios.contract.servable.STATE_COPY_SOURCES` names reach such a graph)."""
    source = binding.source
    if source == S.VALUE_SOURCE_INACTIVE_PADDING:
        target.fill_(binding.padding)
    elif source == S.VALUE_SOURCE_LIVE_ROW_COUNT:
        target.fill_(len(rows) + binding.offset)
    elif binding.indexing == S.INDEXING_SCALAR:  # CONSTANT
        target.fill_(binding.constant)
    else:
        values = [_STATE_COPY_VALUES[source](row, binding) for row in rows]
        write_vector(target, values, binding, pad=binding.indexing == S.INDEXING_SUBMISSION_ROW)

"""The step arena: the device buffers every step rewrites, laid out in one allocation.

A step's per-step inputs (packed tokens and positions, per-row slots, generations, flags,
sampling values, grammar masks, the submission id) are small buffers the packer fills on the host
and uploads before the program (`helios.runtime.execution.pack_staging`). Allocated separately,
each takes its own host->device copy, and on the path to a prompt's first token the host issues
them one by one. Placed in one device allocation (`into_arena`) at offsets a pinned host arena of
the same layout mirrors, the buffers one step rewrites lie side by side, so the packer uploads
them with one copy (a run of neighbours) instead of one per buffer.

Layout: `step_buffers` names the buffers (the rule the packer stages by, plus the completion's
submission input), ordered so that buffers rewritten together are neighbours: grammar masks last
(uploaded only while a row is constrained), before them the buffers bound only by keyed sources
(`KEYED_SOURCES`: values a decode cohort repeats, which the packer does not write again while its
rows stay the same; `helios.runtime.execution.kept_values`), first those a step always rewrites
(tokens, positions, the submission id), each group by the graphs that bind them, then by name. A
steady decode step so writes one run of neighbours: one copy. Each
starts at a multiple of `ALIGN` bytes, as a separate allocation would (so kernels see the same
pointer alignment and the values, hence the outputs, are the same).

Only a device model gets an arena (`helios.runtime.loading.model`); host buffers are written in
place. Nothing here allocates after load.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from helios.contract import serving_pb2 as spb

S = spb

ALIGN = 256  # bytes: each buffer starts where a device allocation of its own would (cudaMalloc: 256)
_MASK_SOURCES = frozenset({S.VALUE_SOURCE_GRAMMAR_MASK, S.VALUE_SOURCE_COPIED_GRAMMAR_MASKS})
# Row-indexed sources whose values are functions of a step's rows' identity and their requests'
# specs (`helios.runtime.execution.kept_values.rows_key_of`): the same rows, the same values.
KEYED_SOURCES = frozenset({
    S.VALUE_SOURCE_SLOT, S.VALUE_SOURCE_GENERATION, S.VALUE_SOURCE_QUERY_LENGTH,
    S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT, S.VALUE_SOURCE_SAMPLING_DECISION, S.VALUE_SOURCE_SEED_BITS,
    S.VALUE_SOURCE_SAMPLING_PARAMETERS, S.VALUE_SOURCE_OUTPUT_LIMIT, S.VALUE_SOURCE_EOS_IDS,
    S.VALUE_SOURCE_LIVE_STATE_ROWS, S.VALUE_SOURCE_CONSTANT,
})


def step_buffers(graphs_of: Mapping[str, object], submission: str = "") -> tuple[str, ...]:
    """The buffers a step rewrites, in arena order: bound (in any of `graphs_of`, a prepared
    contract's graphs) by a value binding that is neither a physical request row (written at
    admission) nor host-table rows (copied from their own frames), and the completion's
    `submission` input when the core has one."""
    graphs: dict[str, set[str]] = {}
    masks: set[str] = set()
    rewritten: set[str] = set()  # bound by some source that is not keyed: written every step
    for name, graph in graphs_of.items():
        for view in graph.bindings:
            if view.indexing == S.INDEXING_PHYSICAL_REQUEST_ROW or view.source == S.VALUE_SOURCE_HOST_TABLE_ROWS:
                continue
            graphs.setdefault(view.buffer, set()).add(name)
            if view.source in _MASK_SOURCES:
                masks.add(view.buffer)
            elif view.source not in KEYED_SOURCES:
                rewritten.add(view.buffer)
    if submission and submission not in graphs:  # every serving graph reads it: beside their common buffers
        graphs[submission] = set().union(*graphs.values())
        rewritten.add(submission)
    return tuple(sorted(graphs, key=lambda name: (name in masks, name not in rewritten, sorted(graphs[name]),
                                                  name)))


def arena_offsets(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets of `tensors` laid out in order at `ALIGN`, and the arena's size."""
    offsets, end = [], 0
    for tensor in tensors:
        offsets.append(end)
        end += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return offsets, max(end, ALIGN)


def into_arena(buffers: Mapping[str, torch.Tensor], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """`buffers` with the named ones (those present) moved into one arena on their device: views of
    one allocation at `arena_offsets`, holding the same values. Every named buffer must be
    contiguous and on one device."""
    present = [name for name in names if name in buffers]
    if not present:
        return dict(buffers)
    devices = {buffers[name].device for name in present}
    if len(devices) != 1:
        raise ValueError(f"step buffers on several devices: {sorted(map(str, devices))}")
    offsets, size = arena_offsets([buffers[name] for name in present])
    arena = torch.zeros(size, dtype=torch.uint8, device=devices.pop())
    moved = dict(buffers)
    for name, offset in zip(present, offsets):
        moved[name] = arena_view(arena, offset, buffers[name])
        moved[name].copy_(buffers[name])
    return moved


def arena_view(arena: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A view of the byte tensor `arena` at `offset` shaped and typed like `like`."""
    nbytes = like.numel() * like.element_size()
    return arena[offset:offset + nbytes].view(like.dtype).view(like.shape)

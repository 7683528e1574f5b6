"""The byte storage `CopyOp`s move between: device pages, slot state rows, continuation rows, host slots.

A contract's history regions name their planes (CACHE_STORAGE buffers). Paged regions (key/value,
latent, sliding window) are sized by physical pages: the page dimension is the one the manifest
sizes by PHYSICAL_PAGES and the token dimension follows it. Recurrent and continuation regions are
sized by state rows: a request slot s owns rows [s * R, (s + 1) * R) of every state plane, R being
`state_rows_per_request` of the selected graphs.

Four kinds of location, each with a page part, a state part, or both (side by side):

| location | page part | state part |
|---|---|---|
| PAGE p | page p of every paged plane | - |
| STATE s | - | the R state rows of slot s |
| CONTINUATION c | one page-sized row of every paged plane | R rows of every state plane |
| HOST h | one page-sized host row of every paged plane | R host rows of every state plane |

A copy moves the first `num_tokens` tokens of the page part when both ends have one (and
`num_tokens` > 0), and the whole state part when both ends have one. So a snapshot tail written
from a partial page and a slot's state (two copies into one continuation row) is offloaded to a
host slot by one copy and restored by two. Continuation and host storage is allocated once, at
startup; copies allocate nothing.

A core with SNAPSHOT and RESTORATION programs copies state between slot rows and snapshot rows
itself, so its snapshot rows are the core's own: every state plane holds the slots' rows, then
the continuation rows' state (`resident_from`, the first snapshot row); the state part of
CONTINUATION c is then rows [resident_from + c * R, ...) of the same planes, which those
programs address (`helios.runtime.execution.state_programs`), and only the page part (partial
pages) is allocated here.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.errors import ExecutionError
from helios.runtime.records.plan import CopyOp, Location, StorageKind
from helios.runtime.cache.window_pages import window_region_name
from helios.runtime.loading.memory_budget import allocation_within, host_pages_allocation


class UnsupportedCopyError(ExecutionError):
    """A plan asks for a copy between storage kinds this model has no storage for, or out of range."""


@dataclass(frozen=True)
class Plane:
    """One buffer of a history region and the dimension its page or state-row extent sizes."""

    tensor: torch.Tensor
    dim: int
    tokens_per_record: int = 1  # a compressed paged plane holds one record per this many tokens


class HistoryStorage:
    """Device planes of the contract plus the continuation and host rows allocated for them."""

    def __init__(self, page_planes: Sequence[Plane], state_planes: Sequence[Plane], rows_per_request: int,
                 continuation_rows: int, host_slots: int, resident_from: int | None = None):
        """`resident_from`: the first snapshot row of the state planes when the continuation rows'
        state lives in them (see the module docstring); None: it is allocated here."""
        self.rows_per_request = max(1, rows_per_request)
        self.continuation_rows = continuation_rows
        self.host_slots = host_slots
        self.resident_from = resident_from
        r = self.rows_per_request
        allocated_state = state_planes if resident_from is None else ()  # else views of the state planes
        with _continuation_allocation(page_planes, allocated_state, continuation_rows, r):
            slots, continuation = list(state_planes), [_rows_like(p, continuation_rows * r) for p in state_planes]
            if resident_from is not None:
                slots = [_narrowed(p, 0, resident_from) for p in state_planes]
                continuation = [_narrowed(p, resident_from, continuation_rows * r) for p in state_planes]
            continuation_pages = [_rows_like(p, continuation_rows) for p in page_planes]
        self._parts: dict[StorageKind, tuple[list[Plane], list[Plane]]] = {
            StorageKind.PAGE: (list(page_planes), []),
            StorageKind.STATE: ([], slots),
            StorageKind.CONTINUATION: (continuation_pages, continuation),
            StorageKind.HOST: _host_parts(page_planes, state_planes, host_slots, r),
        }

    @property
    def has_state(self) -> bool:
        return bool(self._parts[StorageKind.STATE][1])

    def planes(self, kind: StorageKind) -> tuple[list[Plane], list[Plane]]:
        """(page part, state part) planes of a location kind (read-only use, for tests and ranks)."""
        return self._parts[kind]

    def copy(self, op: CopyOp) -> None:
        """Performs one copy (see the module docstring); raises `UnsupportedCopyError` when it
        names a kind without storage here or moves nothing at all."""
        src_pages, src_state = self._part(op.src)
        dst_pages, dst_state = self._part(op.dst)
        moved = False
        if src_pages and dst_pages and op.num_tokens > 0:
            for source, target in zip(src_pages, dst_pages):
                _tokens(target, op.dst.index, op.num_tokens).copy_(_tokens(source, op.src.index, op.num_tokens))
            moved = True
        if src_state and dst_state:
            r = self.rows_per_request
            for source, target in zip(src_state, dst_state):
                target.tensor.narrow(target.dim, op.dst.index * r, r).copy_(
                    source.tensor.narrow(source.dim, op.src.index * r, r))
            moved = True
        if not moved:
            raise UnsupportedCopyError(f"copy {op.src.kind.name} -> {op.dst.kind.name} of {op.num_tokens} "
                                       "tokens moves nothing: no storage holds both ends")

    def _part(self, location: Location) -> tuple[list[Plane], list[Plane]]:
        parts = self._parts.get(location.kind)
        if parts is None:
            raise UnsupportedCopyError(f"no storage of kind {location.kind.name}")
        limit = self._limit(location.kind, parts)
        if not 0 <= location.index < limit:
            raise UnsupportedCopyError(f"{location.kind.name} {location.index} is outside 0..{limit - 1}")
        return parts

    def _limit(self, kind: StorageKind, parts: tuple[list[Plane], list[Plane]]) -> int:
        if kind == StorageKind.CONTINUATION:
            return self.continuation_rows
        if kind == StorageKind.HOST:
            return self.host_slots
        pages, state = parts
        if kind == StorageKind.PAGE:
            return pages[0].tensor.shape[pages[0].dim] if pages else 0
        return state[0].tensor.shape[state[0].dim] // self.rows_per_request if state else 0


_STATE_KINDS = frozenset({spb.HISTORY_KIND_RECURRENT, spb.HISTORY_KIND_CONTINUATION})


def model_storage(model, host_slots: int, continuation_rows: int | None = None) -> HistoryStorage:
    """The storage of a `LoadedModel`: its region planes, `continuation_rows` continuation rows
    (default: the resolved snapshot capacity) and `host_slots` host slots."""
    buffers = {b.name: b for b in model.prepared.manifest.buffers}
    pages, state = [], []
    window = window_region_name(model.prepared)
    for region in model.prepared.contract.model.cache.regions:
        if region.name == window:  # its own page ids: never copied (such layouts take no snapshots)
            continue
        is_state = region.kind in _STATE_KINDS
        extent = mpb.LOAD_EXTENT_STATE_ROWS if is_state else mpb.LOAD_EXTENT_PHYSICAL_PAGES
        for name in region.planes:
            plane = Plane(model.buffers[name], _extent_dim(buffers[name], extent), max(1, region.tokens_per_record))
            (state if is_state else pages).append(plane)
    rows = model.settings.snapshot_capacity if continuation_rows is None else continuation_rows
    resident = model.num_slot_state_rows if model.state_copy_programs else None
    return HistoryStorage(pages, state, model.state_rows_per_request, rows, host_slots, resident)


def _narrowed(plane: Plane, first: int, rows: int) -> Plane:
    """Rows [first, first + rows) of a state plane, as a view (copies write the plane itself)."""
    available = plane.tensor.shape[plane.dim]
    if first + rows > available:
        raise UnsupportedCopyError(f"a state plane of {available} rows cannot hold rows {first}..{first + rows - 1}")
    return Plane(plane.tensor.narrow(plane.dim, first, rows), plane.dim, plane.tokens_per_record)


def _extent_dim(buffer: mpb.Buffer, extent: int) -> int:
    for dim, entry in enumerate(buffer.shape):
        if entry.WhichOneof("extent") == "load_extent" and entry.load_extent == extent:
            return dim
    raise UnsupportedCopyError(f"plane {buffer.name!r} has no {mpb.LoadExtent.Name(extent)} dimension")


def _tokens(plane: Plane, index: int, num_tokens: int) -> torch.Tensor:
    """The records holding the first `num_tokens` tokens of page (or page-sized row) `index`: one
    row per token, or per `tokens_per_record` tokens of a compressed plane (a partial record too)."""
    records = -(-num_tokens // max(1, plane.tokens_per_record))
    return plane.tensor.select(plane.dim, index).narrow(plane.dim, 0, records)


def _continuation_allocation(page_planes: Sequence[Plane], state_planes: Sequence[Plane], rows: int,
                             rows_per_request: int):
    """Guards the continuation rows' allocation (`--snapshot-capacity`, sized by the operator) on the
    planes' device (`allocation_within`); `state_planes`: those whose rows are allocated here."""
    planes = [*page_planes, *state_planes]
    if not planes or rows == 0:
        return contextlib.nullcontext()
    nbytes = rows * (sum(_row_nbytes(p) for p in page_planes)
                     + rows_per_request * sum(_row_nbytes(p) for p in state_planes))
    return allocation_within(f"--snapshot-capacity {rows}: the snapshot rows", nbytes, planes[0].tensor.device,
                             "fewer snapshot rows: --snapshot-capacity N")


def _host_parts(page_planes: Sequence[Plane], state_planes: Sequence[Plane], host_slots: int,
                rows_per_request: int) -> tuple[list[Plane], list[Plane]]:
    """The host slots' planes, checked against the host's memory first (`host_pages_allocation`)."""
    nbytes = host_slots * (sum(_row_nbytes(p) for p in page_planes)
                           + rows_per_request * sum(_row_nbytes(p) for p in state_planes))
    with host_pages_allocation(host_slots, nbytes):
        return ([_rows_like(p, host_slots, host=True) for p in page_planes],
                [_rows_like(p, host_slots * rows_per_request, host=True) for p in state_planes])


def _row_nbytes(plane: Plane) -> int:
    """Bytes of one index of the plane's extent dimension (one page, or one state row)."""
    shape = list(plane.tensor.shape)
    shape[plane.dim] = 1
    return math.prod(shape) * plane.tensor.element_size()


def _rows_like(plane: Plane, rows: int, host: bool = False) -> Plane:
    shape = list(plane.tensor.shape)
    shape[plane.dim] = rows
    device = torch.device("cpu") if host else plane.tensor.device
    return Plane(torch.zeros(shape, dtype=plane.tensor.dtype, device=device), plane.dim, plane.tokens_per_record)

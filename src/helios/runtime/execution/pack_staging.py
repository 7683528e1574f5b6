"""Host staging of shared packing (`helios.runtime.execution.packer`): pinned per-frame mirrors of the buffers a
step rewrites, staged page-table entries and pinned prompt-histogram rows, so a device model's per-step values
travel in one asynchronous copy per buffer (see the packer's module docstring).

Thread ownership: the packer's (one model worker); not thread-safe.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from helios.contract import PreparedContract
from helios.contract import serving_pb2 as spb
from helios.runtime.execution.pack_values import host_array
from helios.runtime.execution.pinned_rows import PinnedRows
from helios.runtime.execution.prompt_histogram import HistogramRows, prompt_counts, write_host_row

S = spb


class Staging:
    """Pinned host mirrors of the device buffers that are rewritten every step (module docstring)."""

    def __init__(self, prepared: PreparedContract, buffers: Mapping[str, torch.Tensor], staged: bool | None):
        """`staged`: None stages the buffers that live off the CPU; True stages every per-step buffer
        (host buffers too: the same logic, testable without a device); False stages none."""
        views = [view for graph in prepared.graphs.values() for view in graph.bindings if view.buffer in buffers]
        # Host-table rows are copied from their own host frames (helios.runtime.execution.host_staging).
        per_step = {view.buffer for view in views if view.indexing != S.INDEXING_PHYSICAL_REQUEST_ROW
                    and view.source != S.VALUE_SOURCE_HOST_TABLE_ROWS}
        self._buffers = buffers
        pinned = torch.cuda.is_available()
        staged_names = [name for name in sorted(per_step)
                        if (buffers[name].device.type != "cpu" if staged is None else staged)]
        # One set of mirrors per execution frame: a frame's mirrors are rewritten only after its
        # previous plan finished (the other frame's upload may still be queued behind a program).
        self._mirror_sets = [
            {name: torch.zeros(buffers[name].shape, dtype=buffers[name].dtype, pin_memory=pinned) for name in staged_names}
            for _ in range(2)
        ]
        self._mirrors = self._mirror_sets[0]
        # Page-table entries of one frame, staged for their asynchronous copies to a device table.
        tables = [view.buffer for view in views if view.source == S.VALUE_SOURCE_PAGE_TABLE
                  and buffers[view.buffer].device.type != "cpu"]
        size = sum(buffers[name].numel() for name in set(tables))  # a step rewrites each table at most once
        self._entry_sets = [torch.zeros(size, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self._entries = self._entry_sets[0]
        self._entries_used = 0
        self._begun: tuple[int, int | None] | None = None
        self._dirty: set[str] = set()
        self._padded_rows: set[tuple[str, int]] = set()  # (buffer, slot) rows holding only padding
        self._row_rings: dict[str, PinnedRows] = {}  # pinned rows of admission values, per device buffer
        # Pinned host rows that device prompt-histogram rows are copied from, per buffer.
        self._histograms: dict[str, HistogramRows] = {}
        for view in views:
            if view.source == S.VALUE_SOURCE_PROMPT_HISTOGRAM and buffers[view.buffer].device.type != "cpu":
                self._histogram_rows(view.buffer, buffers[view.buffer][0])
        # Mask buffers whose device copy may not be all -1 (allocation leaves them zero: all of them).
        self._masks_in_use = {
            view.buffer for view in views if view.source == S.VALUE_SOURCE_GRAMMAR_MASK and view.buffer in self._mirrors
        }

    def write_counts(self, name: str, row: torch.Tensor, tokens: Sequence[int]) -> None:
        """row[:] = the histogram of `tokens`, counted on the host (ids past the row's bins -
        input-only ids: image placeholders, other non-sampled ids - are not counted). A host row is
        written in place; a device row by one asynchronous copy from a pinned host row
        (`helios.runtime.execution.prompt_histogram`): nothing synchronises."""
        ids, counts = prompt_counts(tokens, row.shape[0])
        if row.device.type == "cpu":
            write_host_row(row, ids, counts)
            return
        self._histogram_rows(name, row).write(row, ids, counts)

    def _histogram_rows(self, name: str, row: torch.Tensor) -> HistogramRows:
        rows = self._histograms.get(name)
        if rows is None:
            rows = self._histograms[name] = HistogramRows(row, pinned=torch.cuda.is_available())
            rows.begin(self._begun[0] if self._begun is not None else 0)
        return rows

    def write_row(self, name: str, row: torch.Tensor, values: Sequence) -> None:
        """row[:] = values (a physical request row at admission, `values` shaped like it). A device
        row gets one asynchronous copy from a pinned row (`helios.runtime.execution.pinned_rows`),
        where a copy from pageable memory would synchronise the stream."""
        if row.device.type == "cpu":
            row.copy_(torch.tensor(values, dtype=row.dtype).reshape(row.shape))
            return
        rings = self._row_rings.get(name)
        if rings is None:
            rings = self._row_rings[name] = PinnedRows(row, pinned=torch.cuda.is_available())
            rings.begin(self._begun[0] if self._begun is not None else 0)
        rings.write(row, values)

    def padded_row(self, name: str, slot: int, padded: bool) -> bool:
        """Whether row `slot` of `name` holds nothing but padding now (written so by this staging);
        records whether it will after the caller's write (`padded`). Rows are written only here,
        so a request without logit bias in a slot whose last request had none skips the fill."""
        key = (name, slot)
        holds = key in self._padded_rows
        if padded:
            self._padded_rows.add(key)
        else:
            self._padded_rows.discard(key)
        return holds

    def begin(self, frame: int, sequence: int | None = None) -> None:
        """Packing of a plan of execution frame `frame` starts (its previous plan has finished); a
        second pack of the same submission (its INITIALIZATION program's, then its own) continues."""
        if sequence is not None and self._begun == (frame, sequence):
            return
        self._begun = (frame, sequence)
        for rows in (*self._histograms.values(), *self._row_rings.values()):
            rows.begin(frame)
        self._mirrors = self._mirror_sets[frame % 2]
        self._entries = self._entry_sets[frame % 2]
        self._entries_used = 0

    def write_entries(self, target: torch.Tensor, values: Sequence[int], start: int = 0,
                      padding: int | None = None) -> None:
        """target[start:start + len(values)] = values; with `padding`, every other entry of `target`
        (a whole page-table row, at admission) = padding. A device target gets one asynchronous
        copy from this frame's pinned entries (no device fill, no host synchronisation, so a frame
        can be packed while the other one runs)."""
        span = target if padding is not None else target[start:start + len(values)]
        offset = start if padding is not None else 0
        begin, end = self._entries_used, self._entries_used + span.numel()
        if span.device.type != "cpu" and span.dtype == torch.int32 and end <= self._entries.numel():
            staged = self._entries[begin:end]
            _write_span(staged, offset, values, padding)
            span.copy_(staged, non_blocking=True)
            self._entries_used = end
            return
        # A host target; or (not expected: the entries hold every table) a synchronous copy.
        _write_span(span, offset, values, padding)

    def stages(self, name: str) -> bool:
        """Whether buffer `name` is packed into per-frame mirrors and uploaded."""
        return name in self._mirrors

    def target(self, name: str) -> torch.Tensor:
        mirror = self._mirrors.get(name)
        if mirror is None:
            return self._buffers[name]
        self._dirty.add(name)
        return mirror

    def mask_needed(self, binding, constrained: bool) -> bool:
        """Whether the mask must be written: a row is constrained now, or was on the last upload.
        On the host (no mirror) masks are always written."""
        name = binding.buffer_name
        if name not in self._mirrors:
            return True
        needed = constrained or name in self._masks_in_use
        if constrained:
            self._masks_in_use.add(name)
        else:
            self._masks_in_use.discard(name)
        return needed

    def upload(self) -> None:
        for name in sorted(self._dirty):
            self._buffers[name].copy_(self._mirrors[name], non_blocking=True)
        self._dirty.clear()


def _write_span(span: torch.Tensor, offset: int, values: Sequence[int], padding: int | None) -> None:
    """span[offset:offset + len(values)] = values, the rest = padding (unless None)."""
    array = host_array(span)
    if padding is not None:
        span.fill_(padding)
    if not values:
        return
    if array is not None:
        array[offset:offset + len(values)] = values
    else:
        span[offset:offset + len(values)] = torch.tensor(values, dtype=span.dtype)

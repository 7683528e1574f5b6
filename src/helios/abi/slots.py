"""Each packed token's cache slot in one Triton launch on CUDA (`helios.abi.triton_slots`).

A program maps its packed tokens to flat cache slots (`helios.ignition.decoder.slot_mapping`): the
token's row (a ``searchsorted`` over the rows' query ends), whether it is packed at all, the page
its position falls in through the row's page-table entries, and ``page * page_tokens + position %
page_tokens``, or -1 for a padding token. Traced, that is eleven aten calls, eleven launches of a
microsecond or two on a decode step whatever its size. `packed_slots` computes the same int64
values in one launch; `helios.runtime.loading.slot_calls` binds it where a graph holds the pattern.

Arguments, as the traced calls take them: ``query_start`` int32 [L + 1] (non-decreasing, as a
cumulative sum of query lengths is), ``row_tables`` int32 [R, W] (each row's page-table entries),
``positions`` int64 [T], the page size, the clamp bounds of the row (``last_row``) and of the page
index (``last_page``), and the query-start entry that ends the packed tokens (``packed_end``).
Calls the kernel does not cover (another device, dtype or layout, bounds below zero) run the traced
calls themselves, so a graph bound to it stays exact for every input.
"""

from __future__ import annotations

import torch

__all__ = ["packed_slots", "reference_slots"]


def reference_slots(query_start: torch.Tensor, row_tables: torch.Tensor, positions: torch.Tensor, page_tokens: int,
                    last_row: int, last_page: int, packed_end: int) -> torch.Tensor:
    """The traced calls of `helios.ignition.decoder.slot_mapping`, with these bounds."""
    token_index = torch.arange(positions.shape[0], device=positions.device, dtype=query_start.dtype)
    rows = torch.searchsorted(query_start[1:], token_index, right=True).clamp(max=last_row)
    page_index = torch.div(positions, page_tokens, rounding_mode="floor").clamp(0, last_page)
    slots = row_tables[rows, page_index].to(torch.int64) * page_tokens + torch.remainder(positions, page_tokens)
    return torch.where(token_index < query_start[packed_end], slots, torch.full_like(slots, -1))


def packed_slots(query_start: torch.Tensor, row_tables: torch.Tensor, positions: torch.Tensor, page_tokens: int,
                 last_row: int, last_page: int, packed_end: int) -> torch.Tensor:
    """int64 [T]: each packed token's cache slot, -1 for padding tokens (module docstring). One launch
    on CUDA where covered; the traced calls otherwise. Allocates only its output."""
    if not _covered(query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end):
        return reference_slots(query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end)
    from helios.abi.triton_slots import launch  # imports triton: only where the kernel runs

    return launch(query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end)


def _covered(query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end) -> bool:
    tensors = (query_start, row_tables, positions)
    if not all(t.is_cuda and t.device == positions.device for t in tensors):
        return False
    if query_start.dtype != torch.int32 or row_tables.dtype != torch.int32 or positions.dtype != torch.int64:
        return False
    if query_start.dim() != 1 or row_tables.dim() != 2 or positions.dim() != 1 or query_start.stride(0) != 1 \
            or positions.stride(0) != 1:
        return False
    bounds = (page_tokens, last_row, last_page, packed_end)
    if not all(isinstance(b, int) for b in bounds) or page_tokens <= 0 or last_row < 0 or last_page < 0:
        return False
    return (last_row < row_tables.shape[0] and last_page < row_tables.shape[1]
            and 0 <= packed_end < query_start.shape[0] and positions.shape[0] < 2 ** 31)

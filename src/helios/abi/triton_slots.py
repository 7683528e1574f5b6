"""The Triton kernel behind `helios.abi.slots.packed_slots` (CUDA; CPU under TRITON_INTERPRET=1): each
packed token's cache slot in one launch. Imported only where a call runs it (the wrapper's module
imports no triton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from helios.abi.triton_paged import on_device

__all__ = ["launch"]

_BLOCK_T, _BLOCK_R = 64, 64


@triton.jit
def _slots_kernel(query_start_ptr, tables_ptr, positions_ptr, out_ptr, num_tokens, num_ends, last_row, last_page,
                  packed_end, stride_row, stride_page, PAGE: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_R: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = tokens < num_tokens
    row = tl.zeros([BLOCK_T], tl.int32)
    for start in range(0, num_ends, BLOCK_R):  # searchsorted(right=True) on sorted ends: how many are <= t
        ends_at = start + tl.arange(0, BLOCK_R)
        ends = tl.load(query_start_ptr + 1 + ends_at, mask=ends_at < num_ends, other=0)
        below = (ends[None, :] <= tokens[:, None]) & (ends_at < num_ends)[None, :]
        row += tl.sum(below.to(tl.int32), axis=1)
    row = tl.minimum(row, last_row)
    positions = tl.load(positions_ptr + tokens, mask=live, other=0)
    page_index = positions // PAGE  # C division; floor division below for negative positions
    remainder = positions - page_index * PAGE
    page_index = tl.where(remainder < 0, page_index - 1, page_index)
    remainder = tl.where(remainder < 0, remainder + PAGE, remainder)
    page_index = tl.minimum(tl.maximum(page_index, 0), last_page)
    page = tl.load(tables_ptr + row.to(tl.int64) * stride_row + page_index * stride_page, mask=live, other=0)
    packed = tokens < tl.load(query_start_ptr + packed_end)
    slots = tl.where(packed, page.to(tl.int64) * PAGE + remainder, -1)
    tl.store(out_ptr + tokens, slots, mask=live)


def launch(query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end) -> torch.Tensor:
    """The kernel on a covered call (CPU tensors under the interpreter)."""
    out = torch.empty(positions.shape[0], dtype=torch.int64, device=positions.device)
    if positions.shape[0] == 0:
        return out
    with on_device(positions):
        _slots_kernel[(triton.cdiv(positions.shape[0], _BLOCK_T),)](
            query_start, row_tables, positions, out, positions.shape[0], query_start.shape[0] - 1, last_row, last_page,
            packed_end, row_tables.stride(0), row_tables.stride(1), PAGE=page_tokens, BLOCK_T=_BLOCK_T,
            BLOCK_R=_BLOCK_R)
    return out

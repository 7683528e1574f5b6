"""The Triton kernel of ``helios::paged_attention_chunked`` on CUDA (`helios.abi.attention_chunked`).

One program per (packed token, key/value head): the token's row is found by a binary search of
query_start (`triton_paged.find_row`), and its query heads of that key/value head (the grouped-query
group, padded to a tile of at least 16 rows for ``tl.dot``) walk the token's visible span, the
positions [max(p - p % chunk, p - window + 1, 0), p], in tiles of BLOCK_N positions through the
page table with the online softmax of the other paged kernels (`triton_paged.attend_tile`). A span
is at most one chunk long, so the walk is bounded by the chunk whatever the context. Tokens at or
past query_start[R] (padding) get zeros and read nothing; nothing below a token's span is read.
Every shape is static and nothing is read on the host, so the launch can be captured in a CUDA graph.

A plain kernel (no split of long spans, no query tiles shared between a prompt's tokens): a first
CUDA path for chunked layers, correct for any layout, not tuned.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from helios.abi.triton_paged import (
    LOG2E, attend_tile, block_d, dot_precision, find_row, kv_offsets, on_device, row_major, window_bound,
)

BLOCK_N = 32


@triton.jit(do_not_specialize=["window", "chunk", "num_rows", "max_pages"])
def _chunked_kernel(out_ptr, q_ptr, k_ptr, v_ptr, page_table_ptr, query_start_ptr, positions_ptr, scale_log2,
                    window, chunk, num_rows, max_pages, stride_qt, stride_qh, stride_ot, stride_oh,
                    stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd,
                    stride_pr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_TOKENS: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_m
    m_ok, d_ok = offs_m < GROUP, offs_d < HEAD_DIM
    packed = token < tl.load(query_start_ptr + num_rows)
    row = find_row(query_start_ptr, num_rows, token, 1, False)
    pos = tl.load(positions_ptr + token, mask=packed, other=0).to(tl.int32)
    first = tl.maximum(tl.maximum(pos - window + 1, pos - pos % chunk), 0)
    hi = tl.where(packed, pos + 1, 0)  # padding walks nothing
    q = tl.load(q_ptr + token * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=packed & m_ok[:, None] & d_ok[None, :], other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    kv_strides = (stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd)
    row_pages = row.to(tl.int64) * stride_pr
    for start in range(first // BLOCK_N * BLOCK_N, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        page, offset, valid = kv_offsets(page_table_ptr, row_pages, offs_n, hi, max_pages, PAGE_TOKENS)
        valid = valid & (offs_n >= first)
        allowed = valid[None, :] & m_ok[:, None]
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, page, offset, valid, allowed, kv_head,
                                    offs_d, d_ok, kv_strides, scale_log2, DOT_PRECISION)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def triton_paged_attention_chunked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                   scale: float, window: int, chunk: int) -> torch.Tensor:
    """``helios::paged_attention_chunked`` on validated arguments (see the module docstring)."""
    num_tokens, num_heads, head_dim = q.shape
    page_tokens, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    q = q if q.stride(2) == 1 else q.contiguous()
    page_table = row_major(page_table)
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    with on_device(q):
        _chunked_kernel[(num_tokens, num_kv_heads)](
            out, q, k_cache, v_cache, page_table, query_start, positions, scale * LOG2E, window_bound(window),
            chunk, page_table.shape[0], page_table.shape[1], q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            *k_cache.stride(), *v_cache.stride(), page_table.stride(0), GROUP=group,
            BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N, BLOCK_D=block_d(head_dim),
            HEAD_DIM=head_dim, PAGE_TOKENS=page_tokens, DOT_PRECISION=dot_precision(q))
    return out

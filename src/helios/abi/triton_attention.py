"""Triton kernels of ``helios::cache_write`` and ``helios::paged_attention`` (CUDA; CPU under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.attention`; these kernels compute the same result
without ever reading device data on the host: every launch grid, buffer shape and block size is a
function of tensor shapes and Python arguments only, so a program calling them can be captured into
a CUDA graph. Rows, positions and page ids are read inside the kernels.

Two attention paths, picked from static shapes by `triton_paged_attention`:

- prefill (the general kernel, any layout): the packed tokens are cut into query blocks of at most
  ``BLOCK_M`` consecutive tokens of one row. Rows are contiguous in packed order, so row r owns blocks
  ``query_start[r] // BLOCK_M + r + j`` for j < ceil(len_r / BLOCK_M); the grid holds an upper bound,
  ``T // BLOCK_M + R`` blocks (times Hkv), and a program finds its row by binary search over
  ``query_start``; blocks past their row's tokens exit at once. A program serves all query heads of
  one key/value head (GQA): its ``BLOCK_M x BLOCK_G`` (token, head) pairs are the M dimension of one
  ``tl.dot``, and it runs an online softmax over the cached positions its tokens can see, reading
  keys and values through the page table.
- decode (``T <= R``: at most as many tokens as rows, so almost every row is one token) and tuned
  decode (``helios::paged_attention_tuned``, the split count read from a device tensor): the
  flash-decoding kernels of `helios.abi.triton_decode`, splits cut over each token's own span.

Both paths are correct for any layout (a row of several tokens in a decode-shaped batch, one-token
rows in a prefill batch). Padding tokens (t >= query_start[R]) are never written: the output is
allocated zeroed. Scores, softmax and accumulation are float32; the output has q's dtype.
Page tables are read only below each token's needed page, so junk entries past it are harmless;
positions that need more than ``max_pages`` pages see only the pages the table holds (the CPU
reference raises there; a kernel cannot).

This module imports triton; `helios.abi.attention` imports it lazily, so ``import helios.abi`` works
where triton is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from helios.abi.triton_decode import (
    DecodeTile, decode_splits, decode_tile, grid_splits, paged_attention_decode, paged_attention_decode_tuned,
    tuned_split_bound,
)
from helios.abi.triton_paged import (
    LOG2E, attend_tile, block_d, dot_precision, find_row, kv_offsets, on_device, row_major, sinks_or,
    softmax_start, window_bound,
)

__all__ = [
    "DecodeTile",
    "PrefillTile",
    "decode_splits",
    "decode_tile",
    "grid_splits",
    "paged_attention_decode",
    "paged_attention_decode_tuned",
    "paged_attention_prefill",
    "triton_cache_write",
    "triton_paged_attention",
    "triton_paged_attention_tuned",
    "tuned_split_bound",
]



@dataclass(frozen=True)
class PrefillTile:
    """How one prefill program is shaped: `block_pairs` (token, query head) pairs (BLOCK_M * BLOCK_G,
    a power of two), `block_n` cached positions per iteration, and the Triton launch options. A
    schedule only: every tile gives the same result."""

    block_pairs: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_PREFILL_TILE = PrefillTile()
# Measured tiles by head_dim; absent keys use DEFAULT_PREFILL_TILE. Fill from the "prefill" lines of
# `bench/decode_attention.py --prefill` on the serving device class.
PREFILL_TILES: dict[int, PrefillTile] = {}
# Per-step values are not specialised on (== 1, multiple of 16), so batches of different sizes and
# windows share one compiled kernel.


@triton.jit(do_not_specialize=["window", "num_rows", "max_pages"])
def _prefill_kernel(out_ptr, q_ptr, k_ptr, v_ptr, page_table_ptr, query_start_ptr, positions_ptr, sinks_ptr,
                    scale_log2, window, num_rows, max_pages,
                    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
                    stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, stride_pr,
                    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_TOKENS: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Program (query block b, key/value head): up to BLOCK_M tokens of one row x its GROUP query heads.
    HAS_SINKS: each head's sink logit (sinks_ptr, float32 [Hq]) starts its online softmax."""
    # Highest query blocks first: in a causal prefill they see the most positions, so the longest
    # programs start in the first wave and the last wave holds short ones (a schedule only).
    block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    row = find_row(query_start_ptr, num_rows, block, BLOCK_M, True)
    row_start = tl.load(query_start_ptr + row)
    row_end = tl.load(query_start_ptr + row + 1)
    first = row_start + (block - row_start // BLOCK_M - row) * BLOCK_M
    if first < row_end:
        offs_m = tl.arange(0, BLOCK_M * BLOCK_G)
        token = (first + offs_m // BLOCK_G).to(tl.int64)
        head = kv_head * GROUP + offs_m % BLOCK_G
        token_ok = token < row_end
        m_ok = token_ok & (offs_m % BLOCK_G < GROUP)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        pos = tl.load(positions_ptr + token, mask=token_ok, other=-1).to(tl.int32)
        hi = tl.max(pos) + 1
        lo = tl.maximum(tl.min(tl.where(token_ok, pos, hi)) - window + 1, 0)
        acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
        m_i, l_i = softmax_start(sinks_ptr, head, m_ok, BLOCK_M * BLOCK_G, HAS_SINKS)
        row_pages = row.to(tl.int64) * stride_pr
        kv_strides = (stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd)
        for start in range(lo // BLOCK_N * BLOCK_N, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            page, offset, valid = kv_offsets(page_table_ptr, row_pages, offs_n, hi, max_pages, PAGE_TOKENS)
            valid = valid & (offs_n >= lo)  # below every token's window: never read (may be released)
            allowed = ((offs_n[None, :] <= pos[:, None]) & (pos[:, None] - offs_n[None, :] < window)
                       & valid[None, :])
            acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, page, offset, valid, allowed, kv_head,
                                         offs_d, d_ok, kv_strides, scale_log2, DOT_PRECISION)
        result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 result.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])




@triton.jit
def _cache_write_kernel(k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, slot_ptr,
                        stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd,
                        stride_kn, stride_kth, stride_ktd, stride_vn, stride_vth, stride_vtd,
                        NUM_KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, PAGE_TOKENS: tl.constexpr):
    """Program (token): copy k[t], v[t] [Hkv, D] into flat cache slot slot_mapping[t] unless negative."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h < NUM_KV_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]
        h, d = offs_h[:, None], offs_d[None, :]
        k = tl.load(k_ptr + token * stride_kn + h * stride_kth + d * stride_ktd, mask=mask)
        v = tl.load(v_ptr + token * stride_vn + h * stride_vth + d * stride_vtd, mask=mask)
        page, offset = slot // PAGE_TOKENS, slot % PAGE_TOKENS
        tl.store(k_cache_ptr + page * stride_kp + offset * stride_kt + h * stride_kh + d * stride_kd, k, mask=mask)
        tl.store(v_cache_ptr + page * stride_vp + offset * stride_vt + h * stride_vh + d * stride_vd, v, mask=mask)


def triton_cache_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """``helios::cache_write`` in place: k[t], v[t] go to flat slot slot_mapping[t] of the caches
    [P, page_tokens, Hkv, D]; negative slots are skipped; nothing else is touched. Arguments are
    those of the op, already validated (`check_cache_write_args`). One program per token."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    with on_device(k_cache):
        _cache_write_kernel[(num_tokens,)](
            k_cache, v_cache, k, v, slot_mapping.contiguous(), *k_cache.stride(), *v_cache.stride(),
            *k.stride(), *v.stride(), NUM_KV_HEADS=num_kv_heads, BLOCK_H=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), PAGE_TOKENS=k_cache.shape[1])


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                           scale: float, window: int, *, split: int | None = None,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``helios::paged_attention`` (arguments as the op, already validated): a new [T, Hq, D] tensor.

    The path is chosen from shapes: the decode kernel when T <= R (at most as many tokens as rows),
    else the prefill kernel; both are exact for any layout. `split` is the decode path's number of
    key/value splits (None: `decode_splits`; 1: no split and no combine); the prefill path ignores it.
    `sinks` (float32 [Hq]): ``helios::paged_attention_sinks`` instead.
    """
    if q.shape[0] <= page_table.shape[0]:
        return paged_attention_decode(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                      split=split, sinks=sinks)
    return paged_attention_prefill(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                   sinks=sinks)


def paged_attention_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                            scale: float, window: int, *, sinks: torch.Tensor | None = None,
                            tile: PrefillTile | None = None) -> torch.Tensor:
    """The general kernel: grid (T // BLOCK_M + R, Hkv) query blocks of one row each (see module doc).
    `tile` overrides the head_dim's entry of PREFILL_TILES (benchmarks sweep it)."""
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    out = torch.zeros_like(q)  # the strides of the reference and fake implementations
    if num_tokens == 0 or num_rows == 0:
        return out
    group = num_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    tile = tile or PREFILL_TILES.get(head_dim, DEFAULT_PREFILL_TILE)
    block_m = max(1, tile.block_pairs // block_g)
    page_table = row_major(page_table)
    with on_device(q):
        _prefill_kernel[(num_tokens // block_m + num_rows, num_kv_heads)](
            out, q, k_cache, v_cache, page_table, query_start.contiguous(), positions.contiguous(),
            sinks_or(sinks, q), scale * LOG2E, window_bound(window), num_rows, page_table.shape[1],
            *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), page_table.stride(0),
            GROUP=group, BLOCK_G=block_g, BLOCK_M=block_m, BLOCK_N=tile.block_n, HEAD_DIM=head_dim,
            BLOCK_D=block_d(head_dim), PAGE_TOKENS=k_cache.shape[1], DOT_PRECISION=dot_precision(q),
            HAS_SINKS=sinks is not None, num_warps=tile.num_warps, num_stages=tile.num_stages)
    return out


def triton_paged_attention_tuned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                 scale: float, window: int, splits: torch.Tensor, *,
                                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``helios::paged_attention_tuned`` (arguments as the op, already validated): the tuned decode
    path when T <= R, else the prefill kernel (which ignores `splits`). `sinks`: the sinks variant."""
    if q.shape[0] <= page_table.shape[0]:
        return paged_attention_decode_tuned(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                            splits, sinks=sinks)
    return paged_attention_prefill(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                   sinks=sinks)

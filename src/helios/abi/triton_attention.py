"""Triton kernels of ``helios::cache_write`` and ``helios::paged_attention`` (CUDA; CPU under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.attention`; these kernels compute the same result
without ever reading device data on the host: every launch grid, buffer shape and block size is a
function of tensor shapes and Python arguments only, so a program calling them can be captured into
a CUDA graph. Rows, positions and page ids are read inside the kernels.

Two attention paths, picked from static shapes by `triton_paged_attention`:

- prefill (the general kernel, any layout): the FlashAttention-2-style kernel of
  `helios.abi.triton_prefill` (query blocks of one row, GQA pairs as the M dimension, unmasked tiles
  below the diagonal, a split of the key/value span when the query blocks are few).
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

import torch
import triton
import triton.language as tl

from helios.abi.triton_decode import (
    DecodeTile, decode_splits, decode_tile, grid_splits, paged_attention_decode, paged_attention_decode_tuned,
    tuned_split_bound,
)
from helios.abi.triton_paged import on_device
from helios.abi.triton_prefill import (
    DEFAULT_PREFILL_TILE, PREFILL_TILES, PrefillTile, paged_attention_prefill, prefill_splits, prefill_tile,
)

__all__ = [
    "DEFAULT_PREFILL_TILE",
    "PREFILL_TILES",
    "DecodeTile",
    "PrefillTile",
    "decode_splits",
    "decode_tile",
    "grid_splits",
    "paged_attention_decode",
    "paged_attention_decode_tuned",
    "paged_attention_prefill",
    "prefill_splits",
    "prefill_tile",
    "triton_cache_write",
    "triton_paged_attention",
    "triton_paged_attention_tuned",
    "tuned_split_bound",
]



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
                           sinks: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """``helios::paged_attention`` (arguments as the op, already validated): a new [T, Hq, D] tensor.

    The path is chosen from shapes: the decode kernel when T <= R (at most as many tokens as rows),
    else the prefill kernel; both are exact for any layout. `split` is the decode path's number of
    key/value splits (None: `decode_splits`; 1: no split and no combine); the prefill path ignores it.
    `sinks` (float32 [Hq]): ``helios::paged_attention_sinks`` instead; `softcap` > 0:
    ``helios::paged_attention_softcap``.
    """
    if q.shape[0] <= page_table.shape[0]:
        return paged_attention_decode(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                      split=split, sinks=sinks, softcap=softcap)
    return paged_attention_prefill(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                   sinks=sinks, softcap=softcap)


def triton_paged_attention_tuned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                 scale: float, window: int, splits: torch.Tensor, *,
                                 sinks: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """``helios::paged_attention_tuned`` (arguments as the op, already validated): the tuned decode
    path when T <= R, else the prefill kernel (which ignores `splits`). `sinks`, `softcap` > 0: the
    sinks and soft-cap variants."""
    if q.shape[0] <= page_table.shape[0]:
        return paged_attention_decode_tuned(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                            splits, sinks=sinks, softcap=softcap)
    return paged_attention_prefill(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                   sinks=sinks, softcap=softcap)

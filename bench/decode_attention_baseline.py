"""The decode path of `helios.abi.triton_attention` as of commit aea9bf5 (splits cut the static capacity
context), kept only so `bench/decode_attention.py` can time the old kernels against the new ones in one
process. Not used by Helios.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from helios.abi.attention import DECODE_MAX_SPLITS
MIN_SPLIT_TOKENS = 256  # the constant as of aea9bf5

__all__ = [
    "decode_partition",
    "decode_splits",
    "paged_attention_decode",
    "paged_attention_decode_tuned",
    "paged_attention_prefill",
    "triton_cache_write",
    "triton_paged_attention",
    "triton_paged_attention_tuned",
    "tuned_split_bound",
]

_LOG2E = 1.4426950408889634
_NO_WINDOW = (1 << 31) - 1  # window bound used when window <= 0: no int32 position difference reaches it
_PREFILL_M = 64  # (token, head) pairs per prefill program: BLOCK_M * BLOCK_G
_BLOCK_N = 64  # cached positions per inner iteration
_MIN_SPLIT_TOKENS = MIN_SPLIT_TOKENS  # shortest useful decode split
_MAX_SPLITS = DECODE_MAX_SPLITS
_CPU_SMS = 8  # stand-in multiprocessor count for interpreted (CPU) launches
_MAX_SMS = 256  # more multiprocessors than any device has: bounds the tuned decode grid
# Per-step values are not specialised on (== 1, multiple of 16), so batches of different sizes and
# windows share one compiled kernel.


@triton.jit
def _find_row(query_start_ptr, num_rows, target, BLOCK: tl.constexpr, BLOCKED: tl.constexpr):
    """Largest row r < num_rows with key(r) <= target; key(r) = query_start[r] // BLOCK + r when
    BLOCKED (the first query block of row r), else query_start[r]. Keys are non-decreasing."""
    lo = tl.program_id(0) * 0
    hi = lo + num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        key = tl.load(query_start_ptr + mid)
        if BLOCKED:
            key = key // BLOCK + mid
        go_right = key <= target
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
    return lo - 1


@triton.jit
def _kv_offsets(page_table_ptr, row_pages, offs_n, limit, max_pages, PAGE_TOKENS: tl.constexpr):
    """Page-table lookup of cached positions offs_n: (page id, offset in the page, mask of positions
    below limit whose page the table holds). Masked lookups read nothing."""
    page_index = offs_n // PAGE_TOKENS
    valid = (offs_n < limit) & (page_index < max_pages)
    page = tl.load(page_table_ptr + row_pages + page_index, mask=valid, other=0).to(tl.int64)
    return page, offs_n % PAGE_TOKENS, valid


@triton.jit
def _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, page, offset, valid, allowed, kv_head, offs_d, d_ok,
                 kv_strides, scale_log2, DOT_PRECISION: tl.constexpr):
    """One online-softmax step over a tile of cached positions: returns the updated (acc, m_i, l_i).
    q [M, BLOCK_D]; page/offset/valid [BLOCK_N]; allowed [M, BLOCK_N] (the causal/window mask);
    kv_strides: (k page, k offset, k head, k dim, v page, v offset, v head, v dim) element strides."""
    k_base = page * kv_strides[0] + offset * kv_strides[1] + kv_head * kv_strides[2]
    v_base = page * kv_strides[4] + offset * kv_strides[5] + kv_head * kv_strides[6]
    k_tile = tl.load(k_ptr + k_base[None, :] + offs_d[:, None] * kv_strides[3],
                     mask=valid[None, :] & d_ok[:, None], other=0.0)
    scores = tl.dot(q, k_tile, input_precision=DOT_PRECISION) * scale_log2
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    probs = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(probs, 1)
    v_tile = tl.load(v_ptr + v_base[:, None] + offs_d[None, :] * kv_strides[7],
                     mask=valid[:, None] & d_ok[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(probs.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _softmax_start(sinks_ptr, head, with_sink, SIZE: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Initial online-softmax (max, sum) of SIZE (query, head) pairs in log2 units: empty, or for
    the pairs `with_sink` the head's sink logit alone (max = sink * log2 e, sum = 1)."""
    m_i = tl.full([SIZE], -1e30, tl.float32)
    l_i = tl.zeros([SIZE], tl.float32)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=with_sink, other=0.0).to(tl.float32) * 1.4426950408889634
        m_i = tl.where(with_sink, sink, m_i)
        l_i = tl.where(with_sink, 1.0, l_i)
    return m_i, l_i


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
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = _find_row(query_start_ptr, num_rows, block, BLOCK_M, True)
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
        m_i, l_i = _softmax_start(sinks_ptr, head, m_ok, BLOCK_M * BLOCK_G, HAS_SINKS)
        row_pages = row.to(tl.int64) * stride_pr
        kv_strides = (stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd)
        for start in range(lo // BLOCK_N * BLOCK_N, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            page, offset, valid = _kv_offsets(page_table_ptr, row_pages, offs_n, hi, max_pages, PAGE_TOKENS)
            valid = valid & (offs_n >= lo)  # below every token's window: never read (may be released)
            allowed = ((offs_n[None, :] <= pos[:, None]) & (pos[:, None] - offs_n[None, :] < window)
                       & valid[None, :])
            acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, page, offset, valid, allowed, kv_head,
                                         offs_d, d_ok, kv_strides, scale_log2, DOT_PRECISION)
        result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 result.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def _tuned_partition(splits_ptr, max_context, MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """`decode_partition` on the device for the count in splits_ptr (clamped to [1, MAX_SPLITS]) with
    a fixed tile: (positions per split, number of splits); the count never exceeds MAX_SPLITS."""
    asked = tl.minimum(tl.maximum(tl.load(splits_ptr), 1), MAX_SPLITS)
    split_len = (max_context + asked - 1) // asked
    split_len = (split_len + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    return split_len, (max_context + split_len - 1) // split_len


@triton.jit(do_not_specialize=["window", "num_rows", "max_pages", "split_len", "max_context"])
def _decode_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, q_ptr, k_ptr, v_ptr, page_table_ptr,
                   query_start_ptr, positions_ptr, splits_ptr, sinks_ptr, scale_log2, window, num_rows, max_pages, split_len,
                   max_context, num_heads, stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
                   stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, stride_pr,
                   GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr, PAGE_TOKENS: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   TUNED: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Program (token, key/value head, split): the token's GROUP query heads over cached positions
    [split * split_len, (split + 1) * split_len). Writes the output (one split) or partials. TUNED:
    the split count is read from splits_ptr (NUM_SPLITS is the grid's bound, splits past it exit).
    HAS_SINKS: split 0 starts its online softmax from the heads' sink logits, so the combine counts
    each sink once."""
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    live = NUM_SPLITS
    if TUNED:
        split_len, live = _tuned_partition(splits_ptr, max_context, NUM_SPLITS, BLOCK_N)
    if (token >= tl.load(query_start_ptr)) & (token < tl.load(query_start_ptr + num_rows)) & (split < live):
        row = _find_row(query_start_ptr, num_rows, token, 1, False)
        pos = tl.load(positions_ptr + token).to(tl.int32)
        lo = tl.maximum(tl.maximum(pos - window + 1, 0), split * split_len)
        hi = tl.minimum(pos + 1, split * split_len + split_len)
        offs_h = tl.arange(0, BLOCK_H)
        head = kv_head * GROUP + offs_h
        h_ok = offs_h < GROUP
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        q = tl.load(q_ptr + token * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
        m_i, l_i = _softmax_start(sinks_ptr, head, h_ok & (split == 0), BLOCK_H, HAS_SINKS)
        row_pages = row.to(tl.int64) * stride_pr
        kv_strides = (stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd)
        for start in range(lo // BLOCK_N * BLOCK_N, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            page, offset, valid = _kv_offsets(page_table_ptr, row_pages, offs_n, hi, max_pages, PAGE_TOKENS)
            valid = valid & (offs_n >= lo)  # nothing below the window is read: its pages may be released
            allowed = valid[None, :]
            acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, page, offset, valid, allowed, kv_head,
                                         offs_d, d_ok, kv_strides, scale_log2, DOT_PRECISION)
        result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        if live == 1:
            tl.store(out_ptr + token * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
                     result.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])
        else:
            part = (token * num_heads + head) * NUM_SPLITS + split
            tl.store(part_m_ptr + part, m_i, mask=h_ok)
            tl.store(part_l_ptr + part, l_i, mask=h_ok)
            tl.store(part_o_ptr + part[:, None] * BLOCK_D + offs_d[None, :], result, mask=h_ok[:, None])


@triton.jit(do_not_specialize=["num_rows", "max_context"])
def _combine_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, query_start_ptr, splits_ptr, num_rows, max_context,
                    num_heads, stride_ot, stride_oh, stride_od,
                    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TUNED: tl.constexpr):
    """Program (token, query head): merge the partial softmaxes into the output. Partials are laid out
    NUM_SPLITS per (token, head); TUNED reads the live count from splits_ptr (one split: the decode
    kernel wrote the output itself and this program does nothing)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    live = NUM_SPLITS
    if TUNED:
        _, live = _tuned_partition(splits_ptr, max_context, NUM_SPLITS, BLOCK_N)
    if (token >= tl.load(query_start_ptr)) & (token < tl.load(query_start_ptr + num_rows)) & (live > 1):
        offs_s = tl.arange(0, BLOCK_S)
        s_ok = offs_s < live
        offs_d = tl.arange(0, BLOCK_D)
        part = (token * num_heads + head) * NUM_SPLITS + offs_s
        m_s = tl.load(part_m_ptr + part, mask=s_ok, other=-1e30)
        l_s = tl.load(part_l_ptr + part, mask=s_ok, other=0.0)
        o_s = tl.load(part_o_ptr + part[:, None] * BLOCK_D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
        weight = l_s * tl.exp2(m_s - tl.max(m_s, 0))
        total = tl.sum(weight, 0)
        result = tl.sum(weight[:, None] * o_s, 0) / tl.where(total == 0.0, 1.0, total)
        tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d * stride_od,
                 result.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


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
    with _on_device(k_cache):
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
                            scale: float, window: int, *, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The general kernel: grid (T // BLOCK_M + R, Hkv) query blocks of one row each (see module doc)."""
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    out = torch.zeros_like(q)  # the strides of the reference and fake implementations
    if num_tokens == 0 or num_rows == 0:
        return out
    group = num_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    block_m = max(1, _PREFILL_M // block_g)
    page_table = _row_major(page_table)
    with _on_device(q):
        _prefill_kernel[(num_tokens // block_m + num_rows, num_kv_heads)](
            out, q, k_cache, v_cache, page_table, query_start.contiguous(), positions.contiguous(),
            _sinks_or(sinks, q), scale * _LOG2E, _window_bound(window), num_rows, page_table.shape[1],
            *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), page_table.stride(0),
            GROUP=group, BLOCK_G=block_g, BLOCK_M=block_m, BLOCK_N=_BLOCK_N, HEAD_DIM=head_dim,
            BLOCK_D=_block_d(head_dim), PAGE_TOKENS=k_cache.shape[1], DOT_PRECISION=_dot_precision(q),
            HAS_SINKS=sinks is not None, num_warps=4, num_stages=2)
    return out


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                           scale: float, window: int, *, split: int | None = None,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Flash-decoding: grid (T, Hkv, splits), one token per program, then a combine kernel when
    splits > 1. The splits cut [0, max_pages * page_tokens) into equal ranges; `split` asks for a
    count (None: `decode_splits`), rounded so each range is a whole number of kernel tiles."""
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    out = torch.zeros_like(q)  # the strides of the reference and fake implementations
    if num_tokens == 0 or num_rows == 0:
        return out
    max_context = page_table.shape[1] * k_cache.shape[1]
    if split is None:
        split = decode_splits(num_tokens, num_kv_heads, max_context, q.device)
    num_splits, split_len, block_n = decode_partition(max_context, split)
    _launch_decode(out, (q, k_cache, v_cache, page_table, query_start, positions), scale, window,
                   (num_splits, split_len, block_n), None, sinks)
    return out


def paged_attention_decode_tuned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                 scale: float, window: int, splits: torch.Tensor, *,
                                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Flash-decoding with the split count read on the device from `splits` (int32 [1]): grid
    (T, Hkv, `tuned_split_bound`), programs of splits past the count exit; the combine kernel runs
    (and reads the count) whenever the bound allows more than one split."""
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    out = torch.zeros_like(q)
    if num_tokens == 0 or num_rows == 0:
        return out
    max_context = page_table.shape[1] * k_cache.shape[1]
    bound = tuned_split_bound(num_tokens, num_kv_heads, max_context)
    num_splits, _, block_n = decode_partition(max_context, bound)
    _launch_decode(out, (q, k_cache, v_cache, page_table, query_start, positions), scale, window,
                   (num_splits, 0, block_n), splits.contiguous(), sinks)
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


def tuned_split_bound(num_tokens: int, num_kv_heads: int, max_context: int) -> int:
    """The most splits a tuned decode launch can use, from static numbers only: no split shorter than
    _MIN_SPLIT_TOKENS, at most _MAX_SPLITS, and no more programs than fill a _MAX_SMS device twice."""
    programs = max(1, num_tokens * num_kv_heads)
    useful = -(-max_context // _MIN_SPLIT_TOKENS)
    return max(1, min(_MAX_SPLITS, useful, -(-2 * _MAX_SMS // programs)))


def _launch_decode(out: torch.Tensor, tensors, scale: float, window: int, partition: tuple[int, int, int],
                   splits: torch.Tensor | None, sinks: torch.Tensor | None = None) -> None:
    """Launch the decode kernel (and the combine kernel when more than one split can run).
    partition: (splits in the grid, positions per split, tile); splits: the tuned count or None;
    sinks: float32 [Hq] sink logits or None."""
    q, k_cache, v_cache, page_table, query_start, positions = tensors
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    num_splits, split_len, block_n = partition
    page_table = _row_major(page_table)
    max_context = page_table.shape[1] * k_cache.shape[1]
    tuned = splits is not None
    block_d = _block_d(head_dim)
    parts = _partials(num_tokens, num_heads, num_splits, block_d, out)
    query_start = query_start.contiguous()
    splits = splits if tuned else query_start  # an unread stand-in
    with _on_device(q):
        _decode_kernel[(num_tokens, num_kv_heads, num_splits)](
            out, *parts, q, k_cache, v_cache, page_table, query_start, positions.contiguous(), splits,
            _sinks_or(sinks, q), scale * _LOG2E, _window_bound(window), num_rows, page_table.shape[1], split_len, max_context, num_heads,
            *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), page_table.stride(0),
            GROUP=num_heads // num_kv_heads, BLOCK_H=max(16, triton.next_power_of_2(num_heads // num_kv_heads)),
            BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=block_d, PAGE_TOKENS=k_cache.shape[1],
            NUM_SPLITS=num_splits, TUNED=tuned, DOT_PRECISION=_dot_precision(q), HAS_SINKS=sinks is not None,
            num_warps=4, num_stages=2)
        if num_splits > 1:
            _combine_kernel[(num_tokens, num_heads)](
                out, *parts, query_start, splits, num_rows, max_context, num_heads, *out.stride(),
                NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
                BLOCK_D=block_d, BLOCK_N=block_n, TUNED=tuned)


def decode_splits(num_tokens: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Default number of decode splits, from static numbers only: enough programs to fill the
    device about twice, no split shorter than _MIN_SPLIT_TOKENS positions, at most _MAX_SPLITS."""
    programs = max(1, num_tokens * num_kv_heads)
    wanted = -(-2 * _multiprocessors(device) // programs)
    useful = -(-max_context // _MIN_SPLIT_TOKENS)
    return max(1, min(wanted, useful, _MAX_SPLITS))


def decode_partition(max_context: int, split: int) -> tuple[int, int, int]:
    """How the decode kernel cuts [0, max_context) for `split` asked splits: (number of splits,
    positions per split, positions per kernel tile). Splits are whole tiles, so fewer may result."""
    split_len = -(-max_context // max(1, split))
    block_n = min(_BLOCK_N, max(16, triton.next_power_of_2(split_len)))
    split_len = -(-split_len // block_n) * block_n
    return max(1, -(-max_context // split_len)), split_len, block_n


def _partials(num_tokens: int, num_heads: int, num_splits: int, block_d: int,
              out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 partial max, sum [T, Hq, S] and accumulator [T, Hq, S, BLOCK_D] buffers (uninitialised:
    the decode kernel writes every entry the combine kernel reads). Without splits, `out` stands in."""
    if num_splits == 1:
        return out, out, out
    shape = (num_tokens, num_heads, num_splits)
    return (torch.empty(shape, dtype=torch.float32, device=out.device),
            torch.empty(shape, dtype=torch.float32, device=out.device),
            torch.empty((*shape, block_d), dtype=torch.float32, device=out.device))


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return _CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _on_device(tensor: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def _sinks_or(sinks: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """The sink logits, or an unread stand-in pointer when the kernel is compiled without sinks."""
    return stand_in if sinks is None else sinks.contiguous()


def _row_major(page_table: torch.Tensor) -> torch.Tensor:
    return page_table if page_table.stride(1) == 1 else page_table.contiguous()


def _window_bound(window: int) -> int:
    return min(window, _NO_WINDOW) if window > 0 else _NO_WINDOW


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(q: torch.Tensor) -> str:
    """float32 inputs use exact float32 products (never TF32); 16-bit inputs use the tensor cores."""
    return "ieee" if q.dtype == torch.float32 else "tf32"

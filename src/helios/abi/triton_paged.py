"""Pieces the paged-attention Triton kernels share (`helios.abi.triton_attention`, the prefill and
cache-write kernels; `helios.abi.triton_decode`, the decode kernels): the row search, the page-table
lookup, one online-softmax tile step, the merge of split runs' partials, the softmax start with sink logits, and the host helpers that
turn tensor shapes into launch arguments. Nothing here reads device data on the host.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
NO_WINDOW = (1 << 31) - 1  # window bound used when window <= 0: no int32 position difference reaches it
CPU_SMS = 8  # stand-in multiprocessor count for interpreted (CPU) launches


@triton.jit
def merge_runs(part_m_ptr, part_l_ptr, part_o_ptr, first_part, ok, runs, SIZE: tl.constexpr, BLOCK_D: tl.constexpr):
    """The normalised output [SIZE, BLOCK_D] (float32) of SIZE pairs from their `runs` partials
    (entries first_part + split). Loads bypass L1 (".cg"): in a fused combine (the decode and
    prefill kernels' last run) other programs of the same launch wrote them."""
    offs_d = tl.arange(0, BLOCK_D)
    m_all = tl.full([SIZE], -1e30, tl.float32)
    weight = tl.zeros([SIZE], tl.float32)
    acc = tl.zeros([SIZE, BLOCK_D], tl.float32)
    for split in range(0, runs):
        part = first_part + split
        m_s = tl.load(part_m_ptr + part, mask=ok, other=-1e30, cache_modifier=".cg")
        l_s = tl.load(part_l_ptr + part, mask=ok, other=0.0, cache_modifier=".cg")
        o_s = tl.load(part_o_ptr + part[:, None] * BLOCK_D + offs_d[None, :], mask=ok[:, None], other=0.0,
                      cache_modifier=".cg")
        m_new = tl.maximum(m_all, m_s)
        alpha = tl.exp2(m_all - m_new)
        w_s = l_s * tl.exp2(m_s - m_new)
        acc = acc * alpha[:, None] + o_s * w_s[:, None]
        weight = weight * alpha + w_s
        m_all = m_new
    return acc / tl.where(weight == 0.0, 1.0, weight)[:, None]


@triton.jit
def find_row(query_start_ptr, num_rows, target, BLOCK: tl.constexpr, BLOCKED: tl.constexpr):
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
def kv_offsets(page_table_ptr, row_pages, offs_n, limit, max_pages, PAGE_TOKENS: tl.constexpr):
    """Page-table lookup of cached positions offs_n: (page id, offset in the page, mask of positions
    below limit whose page the table holds). Masked lookups read nothing."""
    page_index = offs_n // PAGE_TOKENS
    valid = (offs_n < limit) & (page_index < max_pages)
    page = tl.load(page_table_ptr + row_pages + page_index, mask=valid, other=0).to(tl.int64)
    return page, offs_n % PAGE_TOKENS, valid


@triton.jit
def attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, page, offset, valid, allowed, kv_head, offs_d, d_ok,
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
def capped_scores(raw, scale_log2, SOFTCAP: tl.constexpr):
    """(scores, factor) of raw q.k products: SOFTCAP 0, the products themselves and scale_log2 (the
    caller's multiply, unchanged); SOFTCAP > 0 (``helios::paged_attention_softcap``), the capped
    scores ``tanh(scale q.k / c) * c`` already in log2 units, and factor 1.0. tanh(x) is computed
    as 1 - 2 / (exp(2x) + 1) (exact at both ends: exp2 overflows to inf, or 0; within a few units of
    1e-7 of torch's tanh in between), the same code compiled and interpreted (the interpreter has no
    libdevice)."""
    if SOFTCAP > 0.0:
        x = raw * (scale_log2 / SOFTCAP)  # scale q.k / c, times log2 e
        tanh = 1.0 - 2.0 / (tl.exp2(2.0 * x) + 1.0)
        scores = tanh * (SOFTCAP * 1.4426950408889634)
        factor = 1.0
    else:
        scores = raw
        factor = scale_log2
    return scores, factor


@triton.jit
def softmax_start(sinks_ptr, head, with_sink, SIZE: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Initial online-softmax (max, sum) of SIZE (query, head) pairs in log2 units: empty, or for
    the pairs `with_sink` the head's sink logit alone (max = sink * log2 e, sum = 1)."""
    m_i = tl.full([SIZE], -1e30, tl.float32)
    l_i = tl.zeros([SIZE], tl.float32)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=with_sink, other=0.0).to(tl.float32) * 1.4426950408889634
        m_i = tl.where(with_sink, sink, m_i)
        l_i = tl.where(with_sink, 1.0, l_i)
    return m_i, l_i


@functools.lru_cache(maxsize=None)
def multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def on_device(tensor: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def sinks_or(sinks: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """The sink logits, or an unread stand-in pointer when the kernel is compiled without sinks."""
    return stand_in if sinks is None else sinks.contiguous()


def row_major(page_table: torch.Tensor) -> torch.Tensor:
    return page_table if page_table.stride(1) == 1 else page_table.contiguous()


def window_bound(window: int) -> int:
    return min(window, NO_WINDOW) if window > 0 else NO_WINDOW


def block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def dot_precision(q: torch.Tensor) -> str:
    """float32 inputs use exact float32 products (never TF32); 16-bit inputs use the tensor cores."""
    return "ieee" if q.dtype == torch.float32 else "tf32"

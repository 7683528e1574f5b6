"""The Triton prefill kernel of ``helios::paged_attention`` (CUDA; CPU under TRITON_INTERPRET=1), in the
style of FlashAttention-2, with a split of the key/value span for launches of few query blocks.

`helios.abi.triton_attention` dispatches here when T > R (more tokens than rows). The kernel is exact
for any layout (one-token rows, padding, inactive rows, windows, sinks).

Query blocks: the packed tokens are cut into blocks of at most ``BLOCK_M`` consecutive tokens of one
row. Rows are contiguous in packed order, so row r owns blocks ``query_start[r] // BLOCK_M + r + j``
for j < ceil(len_r / BLOCK_M); the grid holds an upper bound, ``T // BLOCK_M + R`` blocks, and a
program finds its row by binary search over ``query_start``; blocks past their row's tokens exit at
once. The highest blocks start first (in a causal prefill they see the most positions).

GQA, two layouts (`helios.abi.triton_prefill_tiles`): packed, a program serves all GROUP query heads
of one key/value head: its ``BLOCK_M x BLOCK_G`` (token, head) pairs, token-major (a token's heads are
adjacent in q), are the M dimension of one ``tl.dot``, so each key and value tile is loaded once for
GROUP heads; per head, a program serves BLOCK_M tokens of one query head and the grid puts heads on
its first axis, so a group's programs run side by side and share key/value tiles through L2.

Output: allocated uninitialised; split 0 of each program also writes zeros for the padding tokens
(outside every row) of its block index's token range, so no fill kernel runs per layer.

Causal split of the work: a block's span of cached positions ``[max(min pos - window + 1, 0), max pos]``
is walked in three runs of ``BLOCK_N`` tiles: tiles below some token's window (masked), tiles every
token of the block sees whole (no mask at all: neither causal, window nor page checks), and the
diagonal tiles (masked). Scores stay float32; the softmax runs in base 2 with ``scale * log2(e)``
applied in the one fused multiply-add that also subtracts the running max.

Split-KV: with few query blocks (a short chunk after a long cached prefix) the grid gets a third axis
of NUM_SPLITS splits (`prefill_splits`, static: from shapes and the multiprocessor count, so it is
fixed when a CUDA graph is captured). Each block's span is cut into at most NUM_SPLITS equal runs of
whole tiles, none shorter than MIN_TILES tiles (data-dependent: a short span uses fewer runs); each run
writes a partial max, sum and normalised accumulator (float32) and `_prefill_combine_kernel` merges a
block's runs, one program per (query block, query head). A block of one run writes its output
directly and its combine programs do nothing. With a fused-combine tile there is no combine launch:
each run counts its arrival on an atomic counter of its (block, head program) and the last to arrive
merges the block's runs itself and re-arms the counter.

Keys and values are read through the page table: a tile's positions map to (page, offset) and every
load is contiguous along the head dimension; page-table entries are read only below each block's
needed page. Nothing below a block's window is read (those pages may have been released).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from helios.abi.triton_paged import (
    LOG2E, block_d, capped_scores, dot_precision, find_row, merge_runs, on_device, row_major, sinks_or, softmax_start,
    window_bound,
)
from helios.abi.triton_prefill_steps import attend_contiguous, consecutive_pages, softmax_step
from helios.abi.triton_prefill_tiles import (
    DEFAULT_PREFILL_TILE, LONG_PREFILL_TILES, LONG_PREFILL_TOKENS, PREFILL_MAX_SPLITS, PREFILL_MIN_SPLIT_TOKENS,
    PREFILL_PROGRAMS_PER_MULTIPROCESSOR, PREFILL_TILES, SHORT_PREFILL_TILES, SHORT_PREFILL_TOKENS, SHORT_ROWS_TILE,
    PrefillTile, parse_tile, prefill_splits, prefill_tile,
)

__all__ = [
    "DEFAULT_PREFILL_TILE", "LONG_PREFILL_TILES", "LONG_PREFILL_TOKENS", "PREFILL_MAX_SPLITS",
    "PREFILL_MIN_SPLIT_TOKENS", "PREFILL_PROGRAMS_PER_MULTIPROCESSOR", "PREFILL_TILES", "SHORT_PREFILL_TILES",
    "SHORT_PREFILL_TOKENS", "SHORT_ROWS_TILE", "PrefillTile", "paged_attention_prefill", "parse_tile",
    "prefill_splits", "prefill_tile",
]


@triton.jit
def _query_block(query_start_ptr, positions_ptr, num_rows, block, window, HEADS: tl.constexpr,
                 BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr):
    """Query block `block`'s row, pair layout and span (HEADS query heads per token, padded to
    BLOCK_G): (row, live, token, pair_head, token_ok, m_ok, pos, lo, hi, pos_min). live: the block
    holds tokens; pairs are token-major; lo/hi bound the cached positions any of its tokens sees;
    pos_min is its lowest token position."""
    row = find_row(query_start_ptr, num_rows, block, BLOCK_M, True)
    row_start = tl.load(query_start_ptr + row)
    row_end = tl.load(query_start_ptr + row + 1)
    first = row_start + (block - row_start // BLOCK_M - row) * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M * BLOCK_G)
    token = (first + offs_m // BLOCK_G).to(tl.int64)
    token_ok = token < row_end
    m_ok = token_ok & (offs_m % BLOCK_G < HEADS)
    pos = tl.load(positions_ptr + token, mask=token_ok, other=-1).to(tl.int32)
    hi = tl.max(pos) + 1
    pos_min = tl.min(tl.where(token_ok, pos, hi))
    lo = tl.maximum(pos_min - window + 1, 0)
    return row, first < row_end, token, offs_m % BLOCK_G, token_ok, m_ok, pos, lo, hi, pos_min


@triton.jit
def _block_runs(lo, hi, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_TILES: tl.constexpr):
    """(first tile's position, tiles per run, runs) of a span [lo, hi): whole BLOCK_N tiles cut into at
    most NUM_SPLITS equal runs of at least MIN_TILES tiles."""
    base = lo // BLOCK_N * BLOCK_N
    tiles = (hi - base + BLOCK_N - 1) // BLOCK_N
    runs = tl.maximum(tl.minimum((tiles + MIN_TILES - 1) // MIN_TILES, NUM_SPLITS), 1)
    return base, (tiles + runs - 1) // runs, runs


@triton.jit
def _tile_step(q, acc, m_i, l_i, start, k_ptr, v_ptr, page_table_ptr, row_pages, kv_base, kv_strides, pos, lo, hi,
               window, max_pages, scale_log2, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               HEAD_DIM: tl.constexpr, PAGE_TOKENS: tl.constexpr, MASKED: tl.constexpr,
               DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr):
    """One online-softmax step over cached positions [start, start + BLOCK_N). MASKED: positions
    outside [lo, hi), past the table's pages, after a token's position or below its window are
    excluded (and not read); unmasked tiles lie wholly inside every token's view. SOFTCAP > 0: the
    scores are capped before the mask (`capped_scores`)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    page_index = offs_n // PAGE_TOKENS
    if MASKED:
        valid = (offs_n >= lo) & (offs_n < hi) & (page_index < max_pages)
        page = tl.load(page_table_ptr + row_pages + page_index, mask=valid, other=0).to(tl.int64)
    else:
        page = tl.load(page_table_ptr + row_pages + page_index).to(tl.int64)
    offset = offs_n % PAGE_TOKENS
    k_rows = k_ptr + kv_base[0] + page * kv_strides[0] + offset * kv_strides[1]
    v_rows = v_ptr + kv_base[1] + page * kv_strides[2] + offset * kv_strides[3]
    k_at = k_rows[:, None] + offs_d[None, :] * kv_strides[4]
    v_at = v_rows[:, None] + offs_d[None, :] * kv_strides[5]
    if MASKED:
        load_ok = valid[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(k_at, mask=load_ok, other=0.0)
        v = tl.load(v_at, mask=load_ok, other=0.0)
    elif HEAD_DIM == BLOCK_D:
        k = tl.load(k_at)
        v = tl.load(v_at)
    else:
        k = tl.load(k_at, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
        v = tl.load(v_at, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    if MASKED:
        scores, factor = capped_scores(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), scale_log2, SOFTCAP)
        allowed = valid[None, :] & (offs_n[None, :] <= pos[:, None]) & (pos[:, None] - offs_n[None, :] < window)
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1) * factor)
        probs = tl.exp2(scores * factor - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(probs, 1)
        acc = tl.dot(probs.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)  # in place
    else:
        acc, m_new, l_i = softmax_step(q, k, v, acc, m_i, l_i, scale_log2, DOT_PRECISION, SOFTCAP)
    return acc, m_new, l_i


@triton.jit
def _attend_run(q, acc, m_i, l_i, kv, descs, pos, lo, hi, pos_min, run_lo, run_hi, window, max_pages, scale_log2,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_TOKENS: tl.constexpr,
                DOT_PRECISION: tl.constexpr, CONTIGUOUS: tl.constexpr, SOFTCAP: tl.constexpr):
    """The online softmax over the run [run_lo, run_hi) of a block's span, in three loops: tiles below
    some token's window (masked), tiles wholly inside every token's view (at or above the highest
    token's window start, at or below the lowest token's position, within the table's pages: no
    mask), then the diagonal (masked). kv: (k_ptr, v_ptr, page_table_ptr, the row's page-table
    offset, (k, v) head offsets, (k page, k offset, v page, v offset, k dim, v dim) strides). CONTIGUOUS:
    the unmasked tiles are read through descs (k and v descriptors, the head's first column) when
    their pages are consecutive. SOFTCAP > 0: every tile's scores are capped (`capped_scores`)."""
    k_ptr, v_ptr, page_table_ptr, row_pages, kv_base, kv_strides = kv
    whole_lo = (tl.maximum(tl.max(pos) - window + 1, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    whole_hi = tl.minimum(pos_min + 1, max_pages * PAGE_TOKENS) // BLOCK_N * BLOCK_N
    mid_lo = tl.minimum(tl.maximum(whole_lo, run_lo), run_hi)
    mid_hi = tl.maximum(tl.minimum(whole_hi, run_hi), mid_lo)
    for start in range(run_lo, mid_lo, BLOCK_N):
        acc, m_i, l_i = _tile_step(q, acc, m_i, l_i, start, k_ptr, v_ptr, page_table_ptr, row_pages, kv_base,
                                   kv_strides, pos, lo, hi, window, max_pages, scale_log2, BLOCK_N, BLOCK_D,
                                   HEAD_DIM, PAGE_TOKENS, True, DOT_PRECISION, SOFTCAP)
    gather_hi = mid_hi
    if CONTIGUOUS:
        consecutive, row0 = consecutive_pages(page_table_ptr, row_pages, mid_lo, mid_hi, BLOCK_N, PAGE_TOKENS)
        if consecutive:
            acc, m_i, l_i = attend_contiguous(q, acc, m_i, l_i, descs[0], descs[1], row0, descs[2], mid_lo, mid_hi,
                                              scale_log2, BLOCK_N, DOT_PRECISION, SOFTCAP)
            gather_hi = mid_lo
    for start in range(mid_lo, gather_hi, BLOCK_N):
        acc, m_i, l_i = _tile_step(q, acc, m_i, l_i, start, k_ptr, v_ptr, page_table_ptr, row_pages, kv_base,
                                   kv_strides, pos, lo, hi, window, max_pages, scale_log2, BLOCK_N, BLOCK_D,
                                   HEAD_DIM, PAGE_TOKENS, False, DOT_PRECISION, SOFTCAP)
    for start in range(mid_hi, run_hi, BLOCK_N):
        acc, m_i, l_i = _tile_step(q, acc, m_i, l_i, start, k_ptr, v_ptr, page_table_ptr, row_pages, kv_base,
                                   kv_strides, pos, lo, hi, window, max_pages, scale_log2, BLOCK_N, BLOCK_D,
                                   HEAD_DIM, PAGE_TOKENS, True, DOT_PRECISION, SOFTCAP)
    return acc, m_i, l_i


@triton.jit
def _zero_padding(out_ptr, query_start_ptr, num_rows, num_tokens, grid_block, first_head, stride_ot, stride_oh,
                  stride_od, HEADS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """Zeros for the padding tokens (outside every row: before query_start[0] or from
    query_start[num_rows] on) among tokens [grid_block * BLOCK_M, + BLOCK_M) x HEADS heads from
    `first_head`. The grid's ``T // BLOCK_M + R`` blocks (R >= 1) cover every token."""
    offs = tl.arange(0, BLOCK_M * BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    token = (grid_block * BLOCK_M + offs // BLOCK_G).to(tl.int64)
    outside = (token < tl.load(query_start_ptr)) | (token >= tl.load(query_start_ptr + num_rows))
    ok = outside & (token < num_tokens) & (offs % BLOCK_G < HEADS)
    at = out_ptr + token[:, None] * stride_ot + (first_head + offs % BLOCK_G)[:, None] * stride_oh
    zeros = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], out_ptr.dtype.element_ty)
    tl.store(at + offs_d[None, :] * stride_od, zeros, mask=ok[:, None] & (offs_d < HEAD_DIM)[None, :])


@triton.jit(do_not_specialize=["window", "num_rows", "max_pages", "num_tokens"])
def _prefill_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, counters_ptr, q_ptr, k_ptr, v_ptr, k_desc, v_desc,
                    page_table_ptr,
                    query_start_ptr, positions_ptr, sinks_ptr, scale_log2, window, num_rows, max_pages, num_heads,
                    num_tokens,
                    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
                    stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, stride_pr,
                    GROUP: tl.constexpr, HEADS: tl.constexpr, HEADS_FIRST: tl.constexpr, BLOCK_G: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_TOKENS: tl.constexpr,
                    NUM_SPLITS: tl.constexpr, MIN_TILES: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    HAS_SINKS: tl.constexpr, FUSED_COMBINE: tl.constexpr, CONTIGUOUS: tl.constexpr,
                    SOFTCAP: tl.constexpr = 0.0):
    """Program (query block, head program, split), or (head program, query block, split) when
    HEADS_FIRST (a GQA group's programs adjacent): up to BLOCK_M tokens of one row x HEADS query heads
    of one key/value head (its GROUP heads, or one) over the split's run of the block's span. Writes the
    output (the block has one run) or the run's partials; split 0 also writes zeros for the padding
    tokens of its block's index range. HAS_SINKS: split 0 starts from the heads' sink logits (the
    combine counts each once). SOFTCAP > 0: scores capped at tanh(s / SOFTCAP) * SOFTCAP
    (``helios::paged_attention_softcap``; 0, the default, compiles no cap). FUSED_COMBINE: the run
    that finishes last (a per-program counter in `counters_ptr`, zero between launches) merges the
    block's partials itself: no combine launch."""
    if HEADS_FIRST:
        head_program = tl.program_id(0)
        grid_block = tl.program_id(1)
        block = tl.num_programs(1) - 1 - grid_block
    else:
        grid_block = tl.program_id(0)
        block = tl.num_programs(0) - 1 - grid_block
        head_program = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = head_program * HEADS // GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    if split == 0:
        _zero_padding(out_ptr, query_start_ptr, num_rows, num_tokens, grid_block, head_program * HEADS, stride_ot,
                      stride_oh, stride_od, HEADS, BLOCK_G, BLOCK_M, HEAD_DIM, BLOCK_D)
    row, live, token, group_index, token_ok, m_ok, pos, lo, hi, pos_min = _query_block(
        query_start_ptr, positions_ptr, num_rows, block, window, HEADS, BLOCK_G, BLOCK_M)
    base, run_tiles, runs = _block_runs(lo, hi, NUM_SPLITS, BLOCK_N, MIN_TILES)
    if live & (split < runs):
        head = head_program * HEADS + group_index
        q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
        m_i, l_i = softmax_start(sinks_ptr, head, m_ok & (split == 0), BLOCK_M * BLOCK_G, HAS_SINKS)
        run_lo = base + split * run_tiles * BLOCK_N
        run_hi = tl.minimum(hi, run_lo + run_tiles * BLOCK_N)
        kv = (k_ptr, v_ptr, page_table_ptr, row.to(tl.int64) * stride_pr, (kv_head * stride_kh, kv_head * stride_vh),
              (stride_kp, stride_kt, stride_vp, stride_vt, stride_kd, stride_vd))
        acc, m_i, l_i = _attend_run(q, acc, m_i, l_i, kv, (k_desc, v_desc, kv_head * HEAD_DIM), pos, lo, hi, pos_min,
                                    run_lo, run_hi, window, max_pages, scale_log2, BLOCK_N, BLOCK_D, HEAD_DIM,
                                    PAGE_TOKENS, DOT_PRECISION, CONTIGUOUS, SOFTCAP)
        result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out_at = out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od
        if NUM_SPLITS == 1:  # a one-split grid: no partials compiled in
            tl.store(out_at, result.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
        elif runs == 1:
            tl.store(out_at, result.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
        else:
            part = (token * num_heads + head) * NUM_SPLITS + split
            tl.store(part_m_ptr + part, m_i, mask=m_ok)
            tl.store(part_l_ptr + part, l_i, mask=m_ok)
            tl.store(part_o_ptr + part[:, None] * BLOCK_D + offs_d[None, :], result, mask=m_ok[:, None])
            if FUSED_COMBINE:  # the block's last run to finish merges them (and re-arms the counter)
                tl.debug_barrier()  # every thread's partials are stored before the release below
                counter = counters_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
                if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == runs - 1:
                    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
                    merged = merge_runs(part_m_ptr, part_l_ptr, part_o_ptr, part - split, m_ok, runs,
                                         BLOCK_M * BLOCK_G, BLOCK_D)
                    tl.store(out_at, merged.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["window", "num_rows"])
def _prefill_combine_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, query_start_ptr, positions_ptr, window,
                            num_rows, num_heads, stride_ot, stride_oh, stride_od, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            NUM_SPLITS: tl.constexpr, MIN_TILES: tl.constexpr):
    """Program (query block, query head): merge the block's runs' partial softmaxes into the output of
    its tokens for that head (one run: the prefill kernel wrote the output itself and this program
    does nothing). The block's span, hence its runs, is that of the prefill kernel's programs."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    row, live, token, _, token_ok, _, pos, lo, hi, _ = _query_block(
        query_start_ptr, positions_ptr, num_rows, block, window, 1, 1, BLOCK_M)
    _, _, runs = _block_runs(lo, hi, NUM_SPLITS, BLOCK_N, MIN_TILES)
    if live & (runs > 1):
        offs_d = tl.arange(0, BLOCK_D)
        result = merge_runs(part_m_ptr, part_l_ptr, part_o_ptr, (token * num_heads + head) * NUM_SPLITS, token_ok,
                             runs, BLOCK_M, BLOCK_D)
        tl.store(out_ptr + token[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od,
                 result.to(out_ptr.dtype.element_ty), mask=token_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


def paged_attention_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                            scale: float, window: int, *, sinks: torch.Tensor | None = None,
                            tile: PrefillTile | None = None, splits: int | None = None,
                            softcap: float = 0.0) -> torch.Tensor:
    """The prefill kernel (arguments as ``helios::paged_attention``, already validated): grid
    (T // BLOCK_M + R, Hkv, splits) packed, (Hq, T // BLOCK_M + R, splits) per head, then the combine
    kernel when splits > 1 (see the module doc). `tile` overrides `prefill_tile`, `splits` overrides
    `prefill_splits` (benchmarks sweep them). `softcap` > 0: the capped scores of
    ``helios::paged_attention_softcap``."""
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    if num_tokens == 0 or num_rows == 0:
        return torch.zeros_like(q)
    group = num_heads // num_kv_heads
    tile = tile or prefill_tile(head_dim, q.dtype, num_tokens, num_rows)
    heads = tile.heads_per_program(group)
    block_m = tile.block_tokens(group)
    max_context = page_table.shape[1] * k_cache.shape[1]
    blocks = num_tokens // block_m + num_rows
    if splits is None:
        splits = prefill_splits(blocks, num_heads // heads, max_context, q.device, tile.min_split_tokens,
                                max_splits=tile.max_splits)
    splits = max(1, min(splits, PREFILL_MAX_SPLITS, -(-max_context // tile.block_n)))
    page_table, query_start, positions = row_major(page_table), query_start.contiguous(), positions.contiguous()
    width = block_d(head_dim)
    out = _output_like(q)  # the strides of the reference and fake implementations; the kernel writes every entry
    parts = _partials(num_tokens, num_heads, splits, width, out)
    grid = (num_heads // heads, blocks, splits) if tile.per_head else (blocks, num_kv_heads, splits)
    fused = tile.fused_combine and splits > 1
    counters = _counters(q.device, grid[0] * grid[1]) if fused else page_table
    descs = _descriptors(k_cache, v_cache, tile.block_n) if tile.contiguous and head_dim == width else (None, None)
    with on_device(q):
        _prefill_kernel[grid](
            out, *parts, counters, q, k_cache, v_cache, *descs, page_table, query_start, positions, sinks_or(sinks, q),
            scale * LOG2E, window_bound(window), num_rows, page_table.shape[1], num_heads, num_tokens,
            *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), page_table.stride(0),
            GROUP=group, HEADS=heads, HEADS_FIRST=tile.per_head, BLOCK_G=triton.next_power_of_2(heads),
            BLOCK_M=block_m, BLOCK_N=tile.block_n, HEAD_DIM=head_dim, BLOCK_D=width, PAGE_TOKENS=k_cache.shape[1],
            NUM_SPLITS=splits, MIN_TILES=tile.min_split_tiles, DOT_PRECISION=dot_precision(q),
            HAS_SINKS=sinks is not None, FUSED_COMBINE=fused, CONTIGUOUS=descs[0] is not None,
            SOFTCAP=float(softcap), num_warps=tile.num_warps, num_stages=tile.num_stages)
        if splits > 1 and not fused:
            _prefill_combine_kernel[(blocks, num_heads)](
                out, *parts, query_start, positions, window_bound(window), num_rows, num_heads, *out.stride(),
                BLOCK_M=block_m, BLOCK_N=tile.block_n, HEAD_DIM=head_dim, BLOCK_D=width, NUM_SPLITS=splits,
                MIN_TILES=tile.min_split_tiles, num_warps=4)
    return out


# Arrival counters of the fused combine, by (device, stream): zero between launches (the last run of a
# block re-arms its counter), so no fill runs per launch. Every buffer is kept: a captured CUDA graph
# holds its address. Launches on one stream never overlap; each stream has its own buffer. A graph
# keeps the buffer of the stream it was captured on, so graphs captured on one stream must not be
# replayed concurrently on different streams (why fused tiles are a swept option, not the default).
_COUNTERS: dict[tuple[str, int | None, int], list[torch.Tensor]] = {}


def _counters(device: torch.device, size: int) -> torch.Tensor:
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    kept = _COUNTERS.setdefault((device.type, device.index, stream), [])
    if not kept or kept[-1].numel() < size:
        kept.append(torch.zeros(max(size, 4096), dtype=torch.int32, device=device))
    return kept[-1]


def _descriptors(k_cache: torch.Tensor, v_cache: torch.Tensor, block_n: int) -> tuple:
    """Tensor descriptors of [BLOCK_N, D] tiles over the caches viewed [pages x page tokens, Hkv x D],
    or (None, None) where a cache is not laid out that way (the kernel then always gathers)."""
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None, None
    head_dim = k_cache.shape[-1]
    return tuple(TensorDescriptor.from_tensor(cache.view(-1, cache.shape[2] * head_dim), [block_n, head_dim])
                 for cache in (k_cache, v_cache))


def _output_like(q: torch.Tensor) -> torch.Tensor:
    """The op's output, uninitialised (the kernel writes padding tokens' zeros itself)."""
    return torch.empty_like(q)


def _partials(num_tokens: int, num_heads: int, num_splits: int, width: int,
              out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 partial max, sum [T, Hq, S] and accumulator [T, Hq, S, width] buffers (uninitialised:
    every run of a block of several runs writes its entries before the combine reads them). Without
    splits, `out` stands in."""
    if num_splits == 1:
        return out, out, out
    shape = (num_tokens, num_heads, num_splits)
    return (torch.empty(shape, dtype=torch.float32, device=out.device),
            torch.empty(shape, dtype=torch.float32, device=out.device),
            torch.empty((*shape, width), dtype=torch.float32, device=out.device))

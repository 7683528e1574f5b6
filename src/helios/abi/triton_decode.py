"""Triton decode kernels of ``helios::paged_attention`` and ``helios::paged_attention_tuned`` (CUDA; CPU
under TRITON_INTERPRET=1). `helios.abi.triton_attention` dispatches here when T <= R (at most as many
tokens as rows, so almost every row is one token); the kernels are exact for any layout all the same.

Flash-decoding with GQA packing: one program per (token, key/value head, split) serves all GROUP query
heads of that key/value head as the M dimension of one ``tl.dot`` (padded to 16), so each cached key
and value is loaded once per token, not once per query head. Splits cut *each token's own span*
``[max(pos - window + 1, 0), pos]`` into equal runs of whole tiles (as flash-decoding does), not the
static capacity context: a 1,000-token row in a 4,096-token capacity uses every split, where a cut of
the capacity would leave most of them idle. A token gets at most the live split count of runs and
none shorter than the tile's `min_split_tokens` (a short span is not cut finer than is worth a
combine); splits past its runs exit. Each run writes a partial max, sum and normalised accumulator
(float32) and the token's runs are merged into the output in one of two ways (`DecodeTile.fused_combine`):

- fused (the default): one launch. Each run's program, after writing its partials, adds one to the
  token and key/value head's counter (an int32 workspace, `_counters`, zero between launches); the
  program that brings it to the token's run count merges every run's partials into the output and
  sets the counter back to zero, so the next launch (or the next replay of a captured CUDA graph)
  starts from zero again. The workspace is one per device, shared by every fused launch on it:
  launches on one device must not overlap (the runtime serves a device from one stream).
- a combine kernel (grid (token, query head)) after the decode kernel.

A token of one run gets its output from the decode kernel directly either way.

The decode program finds its row without a search when the batch is one token per row at that index
(query_start[token] <= token < query_start[token + 1]: two independent loads), else by binary search;
it loads each tile's values with its keys (both in flight before the scores), not after the scores.

The split count is static (`decode_splits`, from shapes) or, for ``helios::paged_attention_tuned``,
read on the device from an int32 [1] tensor that a startup tuning producer wrote: the grid holds a
static bound (`tuned_split_bound`), programs of splits past the count exit, and the combine kernel
reads the count too, so a captured CUDA graph replays whatever the tensor holds.

The tile (positions per inner iteration, warps, pipeline stages) comes from `decode_tile`, a table
keyed by shape that `bench/decode_attention.py` measures on the device; every tile gives the same
result. Every launch grid, buffer shape and tile is a function of tensor shapes only: no host read
of device data, so the launches can be captured into a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from helios.abi.attention import DECODE_MAX_SPLITS, DECODE_PROGRAMS_PER_MULTIPROCESSOR, MIN_SPLIT_TOKENS
from helios.abi.decode_tiles import DECODE_TILES, DEFAULT_TILE, DecodeTile, decode_tile
from helios.abi.dependent_launch import dependent_launch
from helios.abi.triton_decode_rotary import l2_prefetch, rope_table, rotated_heads, write_row_tokens, write_token
from helios.abi.triton_decode_walk import combine_if_last, token_row, walk
from helios.abi.triton_paged import (
    LOG2E, block_d, dot_precision, multiprocessors, on_device, row_major, sinks_or, softmax_start, window_bound,
)

__all__ = [
    "DecodeTile", "decode_splits", "decode_tile", "grid_splits", "paged_attention_decode",
    "paged_attention_decode_tuned", "takes_dependent_launch", "tuned_split_bound",
]

_MAX_SMS = 256  # more multiprocessors than any device has: bounds the tuned decode grid
# The most tokens a decode launch has for it to take programmatic dependent launch where the device
# allows it: the whole greedy step at 64 rows ran 1.010x with it, at 1 row 1.001x, at 256 rows 0.990x
# (bench/results/h200_session32_call3, `--levers pdl_program_ab`), although the launch alone saved
# 0.7-1.3 us at every batch (bench/decode_fixed_cost.py, call 2).
PDL_MAX_TOKENS = 64
L2_CHUNK = 1 << 16  # bytes of one prefetch program's bulk L2 prefetch


@triton.jit
def _live_splits(splits_ptr, NUM_SPLITS: tl.constexpr, TUNED: tl.constexpr):
    """Splits that run: NUM_SPLITS, or (TUNED) the count in splits_ptr clamped to [1, NUM_SPLITS]."""
    live = NUM_SPLITS
    if TUNED:
        live = tl.minimum(tl.maximum(tl.load(splits_ptr), 1), NUM_SPLITS)
    return live


@triton.jit
def _token_splits(pos, window, live, BLOCK_N: tl.constexpr, MIN_TILES: tl.constexpr):
    """(first visible position, first tile's position, tiles per run, runs) of a token: its span
    [max(pos - window + 1, 0), pos] in tiles aligned to BLOCK_N, cut into at most `live` equal runs
    of at least MIN_TILES tiles (a short span is not cut finer than is worth a combine)."""
    first = tl.maximum(pos - window + 1, 0)
    base = first // BLOCK_N * BLOCK_N
    tiles = (pos + 1 - base + BLOCK_N - 1) // BLOCK_N
    runs = tl.maximum(tl.minimum(live, (tiles + MIN_TILES - 1) // MIN_TILES), 1)
    return first, base, (tiles + runs - 1) // runs, runs


@triton.jit
def _token_run(positions_ptr, splits_ptr, token, split, window, NUM_SPLITS: tl.constexpr, TUNED: tl.constexpr,
               BLOCK_N: tl.constexpr, MIN_TILES: tl.constexpr):
    """(first visible position, first tile's position, end, runs) of this program's run of the token's
    span. A one-split grid (NUM_SPLITS == 1, static) walks the whole span with no split arithmetic and
    reads no split count; otherwise `_token_splits` cuts it and splits past the token's runs get
    runs <= split (they exit)."""
    if NUM_SPLITS == 1:
        pos = tl.load(positions_ptr + token).to(tl.int32)
        first = tl.maximum(pos - window + 1, 0)
        lo = first // BLOCK_N * BLOCK_N
        hi = pos + 1
        runs = split + 1
    else:
        live = _live_splits(splits_ptr, NUM_SPLITS, TUNED)
        pos = tl.load(positions_ptr + token, mask=split < live, other=0).to(tl.int32)
        first, base, run_tiles, runs = _token_splits(pos, window, live, BLOCK_N, MIN_TILES)
        lo = base + split * run_tiles * BLOCK_N
        hi = tl.minimum(pos + 1, lo + run_tiles * BLOCK_N)
    return first, lo, hi, runs


@triton.jit
def _guessed_pages(page_table_ptr, guess_pages, max_pages, COLS: tl.constexpr, BLOCK_KV: tl.constexpr,
                   PAGE_TOKENS: tl.constexpr, SPECULATE: tl.constexpr):
    """(SPECULATE) the page entries of positions [0, COLS // BLOCK_KV) of the guessed row (its table
    at guess_pages), loaded first thing, beside the position and row loads they would otherwise
    wait for; else zeros (unused)."""
    if SPECULATE:
        index = tl.arange(0, COLS) // BLOCK_KV // PAGE_TOKENS
        pages = tl.load(page_table_ptr + guess_pages + index, mask=index < max_pages, other=0).to(tl.int64)
    else:
        pages = tl.zeros([COLS], tl.int64)
    return pages


@triton.jit(do_not_specialize=["window", "num_rows", "max_pages"])
def _decode_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, count_ptr, q_ptr, k_ptr, v_ptr, page_table_ptr,
                   query_start_ptr, positions_ptr, splits_ptr, sinks_ptr, scale_log2, window, num_rows, max_pages,
                   num_heads, stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
                   stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, stride_pr,
                   k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh, cos_ptr, sin_ptr, stride_ct,
                   stride_st, slot_ptr, prefetch_ptr, prefetch_bytes, prefetch_chunk, num_tokens, GROUP: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr, PAGE_TOKENS: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   TUNED: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_SINKS: tl.constexpr,
                   MIN_TILES: tl.constexpr, FUSED: tl.constexpr, PREFETCH: tl.constexpr,
                   BLOCK_KV: tl.constexpr, SPECULATE: tl.constexpr, ROTARY: tl.constexpr, KV_PAD: tl.constexpr,
                   L2_PREFETCH: tl.constexpr, PDL: tl.constexpr = False, SOFTCAP: tl.constexpr = 0.0):
    """Program (token, key/value heads, split): the GROUP query heads of each of the BLOCK_KV key/value
    heads from kv_head = program_id(1) * BLOCK_KV (BLOCK_KV > 1: a wide or partly wide tile, each tile
    those key/value heads' keys of its positions, contiguous in a page) over its split's run of cached
    positions (`_token_splits`; splits past the token's runs exit). Writes the output (the token has
    one run) or partials (and, FUSED, the last run to finish merges them: `combine_if_last`); split 0
    of a token outside the rows (padding) writes its heads' zeros, so the output needs no zero fill.
    TUNED: the live split count is read from splits_ptr (NUM_SPLITS is the grid's bound). HAS_SINKS:
    split 0 starts its online softmax from the heads' sink logits, so the combine counts each sink once.
    SPECULATE: the guessed row's first page entries are loaded before the row is known and used when
    the guess holds and the run starts at position 0 (`_guessed_pages`, `walk`). ROTARY: q_ptr holds
    the unrotated queries (unit stride along D), rotated as loaded; this step's keys (k_new_ptr,
    rotated) and values are written to the cache by the programs that read them, before their walk
    (`helios.abi.triton_decode_rotary`); KV_PAD: BLOCK_KV rounded up to a power of two. L2_PREFETCH:
    programs past the num_tokens tokens (grid rows the launch added) ask the L2 cache to fetch
    prefetch_chunk-byte slices of the prefetch_bytes at prefetch_ptr (the next projection's weight,
    read while the attention's latency-bound programs leave the memory idle) and do nothing else.
    PDL (launched with programmatic dependent launch): every program waits for the previous kernel
    first thing, before any load or store, so only the launch and the programs' placement overlap
    the previous kernel's tail. (Loading the position, the rows' bounds and the first page entries
    before the wait saved no more, bench/decode_fixed_cost.py, and is unsafe where the previous
    kernel may still be writing them.) SOFTCAP > 0: scores capped at tanh(s / SOFTCAP) * SOFTCAP
    (``helios::paged_attention_softcap``; 0, the default, compiles no cap)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    token = tl.program_id(0).to(tl.int64)
    is_prefetch = token < 0  # never, unless L2_PREFETCH: a program past the tokens
    if L2_PREFETCH:
        is_prefetch = token >= num_tokens
    if is_prefetch:  # a prefetch program: no attention
        l2_prefetch(prefetch_ptr, prefetch_bytes, prefetch_chunk, token - num_tokens)
    else:
        kv_head = tl.program_id(1) * BLOCK_KV
        split = tl.program_id(2)
        guess = tl.minimum(token, num_rows - 1)  # the row when the batch is one token per row
        spec_pages = _guessed_pages(page_table_ptr, guess * stride_pr, max_pages, BLOCK_N * BLOCK_KV, BLOCK_KV,
                                    PAGE_TOKENS, SPECULATE)
        first, lo, hi, runs = _token_run(positions_ptr, splits_ptr, token, split, window, NUM_SPLITS, TUNED, BLOCK_N,
                                         MIN_TILES)
        offs_h = tl.arange(0, BLOCK_H)
        head = kv_head * GROUP + offs_h
        h_ok = (offs_h < GROUP * BLOCK_KV) & (head < num_heads)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        out_at = out_ptr + token * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od
        out_mask = h_ok[:, None] & d_ok[None, :]
        rows_start, rows_end = tl.load(query_start_ptr), tl.load(query_start_ptr + num_rows)
        if (token >= rows_start) & (token < rows_end) & (split < runs):
            row = token_row(query_start_ptr, num_rows, token)
            kv_strides = (stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd)
            if ROTARY:
                rotary = (k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh, cos_ptr, sin_ptr,
                          stride_ct, stride_st, slot_ptr)
                write_row_tokens(rotary, query_start_ptr, positions_ptr, row, lo, hi, k_ptr, v_ptr, kv_strides, kv_head,
                                 num_heads // GROUP, offs_d, HEAD_DIM, PAGE_TOKENS, BLOCK_KV, KV_PAD)
                table = rope_table(cos_ptr, sin_ptr, stride_ct, stride_st, token, offs_d, HEAD_DIM)
                q = rotated_heads(q_ptr + token * stride_qt + kv_head * GROUP * stride_qh, stride_qh, offs_h,
                                  h_ok[:, None] & d_ok[None, :], table, offs_d)
            else:
                q = tl.load(q_ptr + token * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                            mask=h_ok[:, None] & d_ok[None, :], other=0.0)
            acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
            m_i, l_i = softmax_start(sinks_ptr, head, h_ok & (split == 0), BLOCK_H, HAS_SINKS)
            row_pages = row.to(tl.int64) * stride_pr
            spec = (spec_pages, (lo == 0) & (row == guess))
            acc, m_i, l_i = walk(q, acc, m_i, l_i, k_ptr, v_ptr, page_table_ptr, row_pages, first, lo, hi, max_pages,
                                 kv_head, head // GROUP, num_heads // GROUP, offs_d, d_ok, kv_strides, scale_log2, spec,
                                 BLOCK_N, PAGE_TOKENS, DOT_PRECISION, PREFETCH, BLOCK_KV, SPECULATE, SOFTCAP)
            result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            if NUM_SPLITS == 1:  # a one-split grid: no partials compiled in
                tl.store(out_at, result.to(out_ptr.dtype.element_ty), mask=out_mask)
            elif runs == 1:
                tl.store(out_at, result.to(out_ptr.dtype.element_ty), mask=out_mask)
            else:
                part0 = (token * num_heads + head) * NUM_SPLITS
                tl.store(part_m_ptr + part0 + split, m_i, mask=h_ok)
                tl.store(part_l_ptr + part0 + split, l_i, mask=h_ok)
                tl.store(part_o_ptr + (part0 + split)[:, None] * BLOCK_D + offs_d[None, :], result, mask=h_ok[:, None])
                if FUSED:
                    combine_if_last(out_at, out_mask, count_ptr, token * (num_heads // GROUP) + kv_head, part_m_ptr,
                                    part_l_ptr, part_o_ptr, part0, runs, h_ok, BLOCK_H, BLOCK_D)
        elif (split == 0) & ((token < rows_start) | (token >= rows_end)):  # padding: zeros (no zero-filled output)
            tl.store(out_at, tl.zeros([BLOCK_H, BLOCK_D], out_ptr.dtype.element_ty), mask=out_mask)
            if ROTARY:  # a padding token with a slot is written all the same (as helios::cache_write does)
                write_token(k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh, cos_ptr, sin_ptr,
                            stride_ct, stride_st, slot_ptr, k_ptr, v_ptr,
                            (stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd),
                            token, kv_head, num_heads // GROUP, offs_d, HEAD_DIM, PAGE_TOKENS, BLOCK_KV, KV_PAD)


@triton.jit(do_not_specialize=["window", "num_rows"])
def _combine_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, query_start_ptr, positions_ptr, splits_ptr,
                    window, num_rows, num_heads, stride_ot, stride_oh, stride_od, NUM_SPLITS: tl.constexpr,
                    BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, TUNED: tl.constexpr,
                    BLOCK_N: tl.constexpr, MIN_TILES: tl.constexpr):
    """Program (token, query head): merge the token's runs' partial softmaxes into the output (one
    run: the decode kernel wrote the output itself and this program does nothing)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    live = _live_splits(splits_ptr, NUM_SPLITS, TUNED)
    pos = tl.load(positions_ptr + token).to(tl.int32)
    _, _, _, runs = _token_splits(pos, window, live, BLOCK_N, MIN_TILES)
    if (token >= tl.load(query_start_ptr)) & (token < tl.load(query_start_ptr + num_rows)) & (runs > 1):
        offs_s = tl.arange(0, BLOCK_S)
        s_ok = offs_s < runs
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


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                           scale: float, window: int, *, split: int | None = None,
                           sinks: torch.Tensor | None = None, tile: DecodeTile | None = None,
                           rotary: tuple | None = None, prefetch: torch.Tensor | None = None,
                           pdl: bool | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Flash-decoding (arguments as ``helios::paged_attention``, already validated): grid (T, Hkv,
    splits), then a combine kernel when splits > 1. `split` asks for a count (None: the tile's fixed
    count, else `decode_splits`;
    1: no split and no combine), see `grid_splits`; `tile` overrides `decode_tile` (benchmarks).
    `rotary` = (k, v, cos, sin, slot_mapping): q is unrotated and the kernel rotates it and writes this
    step's keys and values first (``helios::rotary_paged_attention``, `helios.abi.triton_decode_rotary`);
    `prefetch`: a tensor whose bytes extra programs ask the L2 cache to fetch (`l2_prefetch`); `pdl`
    (default: `takes_dependent_launch`) launches with programmatic dependent launch; `softcap` > 0
    caps the scores (``helios::paged_attention_softcap``)."""
    num_tokens, _, head_dim = q.shape
    if num_tokens == 0 or page_table.shape[0] == 0:
        return torch.zeros_like(q)
    out = _output(q)  # the kernel writes every entry (a padding token's zeros too), so no fill launch
    tile = tile or decode_tile(num_tokens, head_dim)
    max_context = page_table.shape[1] * k_cache.shape[1]
    if split is None:
        split = tile.splits or decode_splits(num_tokens, k_cache.shape[2], max_context, q.device)
    _launch(out, (q, k_cache, v_cache, page_table, query_start, positions), scale, window,
            grid_splits(max_context, split, tile.block_n), None, sinks, tile, rotary, prefetch, pdl, softcap)
    return out


def paged_attention_decode_tuned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                 scale: float, window: int, splits: torch.Tensor, *,
                                 sinks: torch.Tensor | None = None, tile: DecodeTile | None = None,
                                 bound: int | None = None, rotary: tuple | None = None,
                                 prefetch: torch.Tensor | None = None, pdl: bool | None = None,
                                 softcap: float = 0.0) -> torch.Tensor:
    """Flash-decoding with the split count read on the device from `splits` (int32 [1]): grid
    (T, Hkv, `tuned_split_bound`), programs of splits past the count exit; the combine kernel runs
    (and reads the count) whenever the bound allows more than one split. A tile with a fixed split
    count (`DecodeTile.splits`) launches that many instead and reads no count. `tile` and `bound` (the
    grid's split bound) override the static choices (benchmarks sweep them); `rotary`, `prefetch`,
    `pdl` and `softcap` as `paged_attention_decode`."""
    num_tokens, _, head_dim = q.shape
    if num_tokens == 0 or page_table.shape[0] == 0:
        return torch.zeros_like(q)
    out = _output(q)  # every entry written by the kernel, as `paged_attention_decode`
    tile = tile or decode_tile(num_tokens, head_dim)
    max_context = page_table.shape[1] * k_cache.shape[1]
    if tile.splits:  # a fixed count: the static launch, the tuned count is not read
        _launch(out, (q, k_cache, v_cache, page_table, query_start, positions), scale, window,
                grid_splits(max_context, tile.splits, tile.block_n), None, sinks, tile, rotary, prefetch, pdl,
                softcap)
        return out
    bound = bound or tuned_split_bound(num_tokens, k_cache.shape[2], max_context)
    _launch(out, (q, k_cache, v_cache, page_table, query_start, positions), scale, window,
            grid_splits(max_context, bound, tile.block_n),
            splits.contiguous(), sinks, tile, rotary, prefetch, pdl, softcap)
    return out


def _output(q: torch.Tensor) -> torch.Tensor:
    """The uninitialised output: q's strides (those of the reference and fake implementations) when
    q is dense, else contiguous (a rotary launch's q is a view of the fused qkv product)."""
    return torch.empty_like(q) if q.is_contiguous() else torch.empty(q.shape, dtype=q.dtype, device=q.device)


def tuned_split_bound(num_tokens: int, num_kv_heads: int, max_context: int) -> int:
    """The most splits a tuned decode launch can use, from static numbers only: the most the tuning
    producer asks on a device of _MAX_SMS multiprocessors (see `helios.ignition.tuning`)."""
    programs = max(1, num_tokens * num_kv_heads)
    useful = -(-max_context // MIN_SPLIT_TOKENS)
    return max(1, min(DECODE_MAX_SPLITS, useful, -(-DECODE_PROGRAMS_PER_MULTIPROCESSOR * _MAX_SMS // programs)))


def decode_splits(num_tokens: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Default number of decode splits, from static numbers only: the tuning producer's rule for this
    device (about DECODE_PROGRAMS_PER_MULTIPROCESSOR programs per multiprocessor)."""
    programs = max(1, num_tokens * num_kv_heads)
    wanted = -(-DECODE_PROGRAMS_PER_MULTIPROCESSOR * multiprocessors(device) // programs)
    useful = -(-max_context // MIN_SPLIT_TOKENS)
    return max(1, min(wanted, useful, DECODE_MAX_SPLITS))


def grid_splits(max_context: int, split: int, block_n: int) -> int:
    """Splits in the grid for `split` asked: at least 1, at most DECODE_MAX_SPLITS and no more than
    one tile of the capacity context each (a token's span never exceeds the capacity)."""
    return max(1, min(split, DECODE_MAX_SPLITS, -(-max_context // block_n)))


def _launch(out: torch.Tensor, tensors, scale: float, window: int, num_splits: int, splits: torch.Tensor | None,
            sinks: torch.Tensor | None, tile: DecodeTile, rotary: tuple | None = None,
            prefetch: torch.Tensor | None = None, pdl: bool | None = None, softcap: float = 0.0) -> None:
    """Launch the decode kernel (and the combine kernel when more than one split can run and the tile
    does not fuse the combine). splits: the tuned count (int32 [1]) or None; sinks: float32 [Hq] sink
    logits or None; rotary: (k, v, cos, sin, slot_mapping) with unit strides along D, or None;
    prefetch: a contiguous tensor the added prefetch programs fetch into L2, or None; pdl: launch with
    programmatic dependent launch (None: `takes_dependent_launch`); softcap: the scores' cap (0: none)."""
    q, k_cache, v_cache, page_table, query_start, positions = tensors
    pdl = takes_dependent_launch(q) if pdl is None else pdl
    num_tokens, num_heads, head_dim = q.shape
    num_rows, num_kv_heads = page_table.shape[0], k_cache.shape[2]
    page_table, query_start, positions = row_major(page_table), query_start.contiguous(), positions.contiguous()
    tuned, width = splits is not None, block_d(head_dim)
    fused = tile.fused_combine and num_splits > 1
    block_kv = tile.heads_per_program(num_kv_heads)  # key/value heads a program serves
    heads = block_kv * (num_heads // num_kv_heads)  # query heads a program serves
    block_n = max(tile.block_n, 16 // block_kv)  # at least 16 columns for the dot
    parts = _partials(num_tokens, num_heads, num_splits, width, out)
    counts = _counters(out.device, num_tokens * num_kv_heads) if fused else query_start  # else: unread
    splits = splits if tuned else query_start  # an unread stand-in
    if rotary is None:  # unread stand-ins
        rotary_args = (q, q, 0, 0, 0, 0, q, q, 0, 0, query_start)
    else:
        k, v, cos, sin, slots = rotary
        rotary_args = (k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos, sin, cos.stride(0),
                       sin.stride(0), slots.contiguous())
    programs = triton.cdiv(num_kv_heads, block_kv) * num_splits  # a grid row's programs
    prefetch_args, prefetch_rows = (q, 0, L2_CHUNK, num_tokens), 0
    if prefetch is not None:
        total = prefetch.numel() * prefetch.element_size() // 16 * 16
        prefetch_rows = triton.cdiv(triton.cdiv(total, L2_CHUNK), programs)
        prefetch_args = (prefetch, total, L2_CHUNK, num_tokens)
    with on_device(q):
        _decode_kernel[(num_tokens + prefetch_rows, triton.cdiv(num_kv_heads, block_kv), num_splits)](
            out, *parts, counts, q, k_cache, v_cache, page_table, query_start, positions, splits,
            sinks_or(sinks, q), scale * LOG2E, window_bound(window), num_rows, page_table.shape[1], num_heads,
            *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), page_table.stride(0), *rotary_args,
            *prefetch_args,
            GROUP=num_heads // num_kv_heads, BLOCK_H=max(16, triton.next_power_of_2(heads)), BLOCK_KV=block_kv,
            BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=width, PAGE_TOKENS=k_cache.shape[1],
            NUM_SPLITS=num_splits, TUNED=tuned, DOT_PRECISION=dot_precision(q), HAS_SINKS=sinks is not None,
            MIN_TILES=max(1, -(-tile.min_split_tokens // block_n)), FUSED=fused, PREFETCH=tile.prefetch,
            SPECULATE=tile.speculate and tile.prefetch > 0, ROTARY=rotary is not None,
            KV_PAD=triton.next_power_of_2(block_kv), L2_PREFETCH=prefetch is not None, PDL=pdl,
            SOFTCAP=float(softcap), num_warps=tile.num_warps, num_stages=tile.num_stages, launch_pdl=pdl)
        if num_splits > 1 and not fused:
            _combine_kernel[(num_tokens, num_heads)](
                out, *parts, query_start, positions, splits, window_bound(window), num_rows, num_heads,
                *out.stride(), NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
                BLOCK_D=width, TUNED=tuned, BLOCK_N=block_n, MIN_TILES=max(1, -(-tile.min_split_tokens // block_n)))


def takes_dependent_launch(q: torch.Tensor) -> bool:
    """Whether a decode launch for queries `q` [T, Hq, D] takes programmatic dependent launch by
    default: where `helios.abi.dependent_launch` allows it, for at most PDL_MAX_TOKENS tokens."""
    return q.shape[0] <= PDL_MAX_TOKENS and dependent_launch(q)


_COUNTERS: dict[tuple[str, int | None, int], torch.Tensor] = {}
_MIN_COUNTERS = 1 << 12  # 512 tokens of 8 key/value heads: one workspace serves every decode batch below it


def _counters(device: torch.device, needed: int) -> torch.Tensor:
    """The device's fused-combine counters (int32, at least `needed`, a power of two of at least
    _MIN_COUNTERS), zero between launches: allocated zeroed once per size and kept for the process (a
    captured CUDA graph holds their address), every launch leaves them zero again. Allocated during a
    capture, the zeroing is captured too and each replay repeats it, which is harmless."""
    size = max(_MIN_COUNTERS, triton.next_power_of_2(max(needed, 1)))
    key = (device.type, device.index, size)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return counters


def _partials(num_tokens: int, num_heads: int, num_splits: int, width: int,
              out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 partial max, sum [T, Hq, S] and accumulator [T, Hq, S, width] buffers (uninitialised:
    the decode kernel writes every entry of a live split that the combine kernel reads). Without
    splits, `out` stands in."""
    if num_splits == 1:
        return out, out, out
    shape = (num_tokens, num_heads, num_splits)
    return (torch.empty(shape, dtype=torch.float32, device=out.device),
            torch.empty(shape, dtype=torch.float32, device=out.device),
            torch.empty((*shape, width), dtype=torch.float32, device=out.device))

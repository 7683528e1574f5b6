"""The per-tile steps of the decode kernel (`helios.abi.triton_decode`): the row lookup, a tile's page
entries, keys and values (of one key/value head, or of all of them for a wide tile), the masked
online-softmax step, the walk over a run with its prefetch levels, and the fused combine of a split
token's runs. Triton device functions only; CUDA, or the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import triton
import triton.language as tl

from helios.abi.triton_paged import capped_scores, find_row, kv_offsets, merge_runs

__all__ = ["combine_if_last", "token_row", "walk"]


@triton.jit
def token_row(query_start_ptr, num_rows, token):
    """The row of `token` (as `find_row`): the row of the same index when it holds the token (one token
    per row: two independent loads, no search), else the binary search."""
    guess = tl.minimum(token, num_rows - 1)
    row_start = tl.load(query_start_ptr + guess)
    row_end = tl.load(query_start_ptr + guess + 1)
    if (row_start <= token) & (token < row_end):
        row = guess.to(tl.int32)
    else:
        row = find_row(query_start_ptr, num_rows, token, 1, False).to(tl.int32)
    return row


@triton.jit
def _tile_pages(page_table_ptr, row_pages, start, first, hi, max_pages, heads_left, BLOCK_N: tl.constexpr,
                PAGE_TOKENS: tl.constexpr, BLOCK_KV: tl.constexpr):
    """(page, offset, valid) of the tile's BLOCK_N * BLOCK_KV columns: positions [start, start + BLOCK_N)
    (each of BLOCK_KV key/value heads, position-major, when BLOCK_KV > 1: a wide tile), valid below hi,
    at or past `first` (nothing below the window is read: its pages may be released), in the table,
    and (wide) of one of the `heads_left` key/value heads from the program's first."""
    cols = tl.arange(0, BLOCK_N * BLOCK_KV)
    offs_n = start + cols // BLOCK_KV
    page, offset, valid = kv_offsets(page_table_ptr, row_pages, offs_n, hi, max_pages, PAGE_TOKENS)
    valid = valid & (offs_n >= first)
    if BLOCK_KV > 1:
        valid = valid & (cols % BLOCK_KV < heads_left)
    return page, offset, valid


@triton.jit
def _pages_at(geometry, start, BLOCK_N: tl.constexpr, PAGE_TOKENS: tl.constexpr, BLOCK_KV: tl.constexpr):
    """`_tile_pages` of the tile at `start`; geometry: (page table, row_pages, first, hi, max_pages,
    key/value heads from the program's first) of the program's run."""
    return _tile_pages(geometry[0], geometry[1], start, geometry[2], geometry[3], geometry[4], geometry[5], BLOCK_N,
                       PAGE_TOKENS, BLOCK_KV)


@triton.jit
def _first_pages(geometry, lo, spec, BLOCK_N: tl.constexpr, PAGE_TOKENS: tl.constexpr, BLOCK_KV: tl.constexpr,
                 SPECULATE: tl.constexpr):
    """`_pages_at` of the run's first tile, or (SPECULATE, and spec = (pages, usable) says the
    program's early page-table load of its guessed row's first tile fits: the run starts at position
    0 of that row) the same (page, offset, valid) from those pages, with no page-table load between
    the row lookup and the first keys and values."""
    if SPECULATE:
        if spec[1]:
            cols = tl.arange(0, BLOCK_N * BLOCK_KV)
            offs_n = lo + cols // BLOCK_KV
            valid = (offs_n < geometry[3]) & (offs_n // PAGE_TOKENS < geometry[4]) & (offs_n >= geometry[2])
            if BLOCK_KV > 1:
                valid = valid & (cols % BLOCK_KV < geometry[5])
            page, offset = spec[0], offs_n % PAGE_TOKENS
        else:
            page, offset, valid = _pages_at(geometry, lo, BLOCK_N, PAGE_TOKENS, BLOCK_KV)
    else:
        page, offset, valid = _pages_at(geometry, lo, BLOCK_N, PAGE_TOKENS, BLOCK_KV)
    return page, offset, valid


@triton.jit
def _score_mask(valid, kv_cols, kv_rows, BLOCK_KV: tl.constexpr):
    """The scores' mask: valid columns, and (wide tile) only the columns of each query head's own
    key/value head."""
    if BLOCK_KV > 1:
        mask = valid[None, :] & (kv_cols[None, :] == kv_rows[:, None])
    else:
        mask = valid[None, :]
    return mask


@triton.jit
def _load_kv(k_ptr, v_ptr, page, offset, valid, kv_head, offs_d, d_ok, kv_strides):
    """A tile's keys [BLOCK_D, BLOCK_N] and values [BLOCK_N, BLOCK_D], both loads issued together."""
    k_base = page * kv_strides[0] + offset * kv_strides[1] + kv_head * kv_strides[2]
    v_base = page * kv_strides[4] + offset * kv_strides[5] + kv_head * kv_strides[6]
    k_tile = tl.load(k_ptr + k_base[None, :] + offs_d[:, None] * kv_strides[3],
                     mask=valid[None, :] & d_ok[:, None], other=0.0)
    v_tile = tl.load(v_ptr + v_base[:, None] + offs_d[None, :] * kv_strides[7],
                     mask=valid[:, None] & d_ok[None, :], other=0.0)
    return k_tile, v_tile


@triton.jit
def _attend(q, acc, m_i, l_i, k_tile, v_tile, allowed, scale_log2, DOT_PRECISION: tl.constexpr,
            SOFTCAP: tl.constexpr):
    """One online-softmax step over a loaded tile (as `attend_tile`; `allowed` from `_score_mask`);
    SOFTCAP > 0: the scores capped before the mask (`capped_scores`)."""
    scores, factor = capped_scores(tl.dot(q, k_tile, input_precision=DOT_PRECISION), scale_log2, SOFTCAP)
    scores = scores * factor
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    probs = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(probs, 1)
    acc = acc * alpha[:, None] + tl.dot(probs.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def walk(q, acc, m_i, l_i, k_ptr, v_ptr, page_table_ptr, row_pages, first, lo, hi, max_pages, kv_head, kv_rows,
         num_kv_heads, offs_d, d_ok, kv_strides, scale_log2, spec, BLOCK_N: tl.constexpr, PAGE_TOKENS: tl.constexpr,
         DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_KV: tl.constexpr, SPECULATE: tl.constexpr,
         SOFTCAP: tl.constexpr = 0.0):
    """The online softmax over the run [lo, hi) in tiles of BLOCK_N positions (of one key/value head
    `kv_head`, or, BLOCK_KV > 1, of the BLOCK_KV from `kv_head`: query head rows see their own, `kv_rows`). PREFETCH
    0: each tile's page entries, then its keys and values; 1: the next tile's page entries are loaded
    before this tile's keys and values; 2: the next tile's keys and values too (two tiles in flight,
    twice the registers). SPECULATE (prefetch 1 or 2): the first tile's page entries may come from
    `spec` (`_first_pages`). SOFTCAP > 0: scores capped (``helios::paged_attention_softcap``)."""
    kv_cols = kv_head + tl.arange(0, BLOCK_N * BLOCK_KV) % BLOCK_KV
    geometry = (page_table_ptr, row_pages, first, hi, max_pages, num_kv_heads - kv_head)
    if PREFETCH == 0:
        for start in range(lo, hi, BLOCK_N):
            page, offset, valid = _pages_at(geometry, start, BLOCK_N, PAGE_TOKENS, BLOCK_KV)
            k_tile, v_tile = _load_kv(k_ptr, v_ptr, page, offset, valid, kv_cols, offs_d, d_ok, kv_strides)
            mask = _score_mask(valid, kv_cols, kv_rows, BLOCK_KV)
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_tile, v_tile, mask, scale_log2, DOT_PRECISION, SOFTCAP)
    elif PREFETCH == 1:
        page, offset, valid = _first_pages(geometry, lo, spec, BLOCK_N, PAGE_TOKENS, BLOCK_KV, SPECULATE)
        for start in range(lo, hi, BLOCK_N):
            n_page, n_offset, n_valid = _pages_at(geometry, start + BLOCK_N, BLOCK_N, PAGE_TOKENS, BLOCK_KV)
            k_tile, v_tile = _load_kv(k_ptr, v_ptr, page, offset, valid, kv_cols, offs_d, d_ok, kv_strides)
            mask = _score_mask(valid, kv_cols, kv_rows, BLOCK_KV)
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_tile, v_tile, mask, scale_log2, DOT_PRECISION, SOFTCAP)
            page, offset, valid = n_page, n_offset, n_valid
    else:
        page, offset, valid = _first_pages(geometry, lo, spec, BLOCK_N, PAGE_TOKENS, BLOCK_KV, SPECULATE)
        k_tile, v_tile = _load_kv(k_ptr, v_ptr, page, offset, valid, kv_cols, offs_d, d_ok, kv_strides)
        for start in range(lo, hi, BLOCK_N):
            n_page, n_offset, n_valid = _pages_at(geometry, start + BLOCK_N, BLOCK_N, PAGE_TOKENS, BLOCK_KV)
            n_k, n_v = _load_kv(k_ptr, v_ptr, n_page, n_offset, n_valid, kv_cols, offs_d, d_ok, kv_strides)
            mask = _score_mask(valid, kv_cols, kv_rows, BLOCK_KV)
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_tile, v_tile, mask, scale_log2, DOT_PRECISION, SOFTCAP)
            k_tile, v_tile, valid = n_k, n_v, n_valid
    return acc, m_i, l_i


@triton.jit
def combine_if_last(out_at, out_mask, count_ptr, slot, part_m_ptr, part_l_ptr, part_o_ptr, part0, runs, h_ok,
                    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Fused combine: count this run done on the token's counter `slot`; the program that completes the
    count merges the `runs` partials at part0 + split ([BLOCK_H] rows) into the output and resets the
    counter to zero. The barrier orders every thread's partial stores before the (release) count; the
    last program reads the partials past the L1 cache, after its (acquire) count."""
    tl.debug_barrier()
    done = tl.atomic_add(count_ptr + slot, 1, sem="acq_rel")
    if done == runs - 1:
        tl.debug_barrier()
        result = merge_runs(part_m_ptr, part_l_ptr, part_o_ptr, part0, h_ok, runs, BLOCK_H, BLOCK_D)
        tl.store(out_at, result.to(out_at.dtype.element_ty), mask=out_mask)
        tl.store(count_ptr + slot, 0)

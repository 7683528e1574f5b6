"""Triton kernels of ``helios::latent_cache_write`` and ``helios::paged_latent_attention`` (CUDA; CPU
under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.latent_attention`. As in
`helios.abi.triton_attention`, every launch grid, buffer shape and block size is a function of tensor
shapes and Python arguments only (rows, positions and page ids are read inside the kernels), so a
program calling them can be captured into a CUDA graph.

Attention: one program per (query tile, block of ``BLOCK_H`` query heads, context split). A query
tile is up to ``BLOCK_T`` consecutive tokens of one row (one token for decode launches, several for
prefill, mixed and speculative rows); tiles are numbered row by row, found by a binary search over
the rows' starts as in the attention prefill kernel. Every head of a row reads the same latent and
rotary key per cached position (one shared key/value head), so a program loads each page-table entry
and each latent vector once for all its tokens and heads: tokens x heads are the M dimension of the
two ``tl.dot`` products (scores over the latent and the rotary key; the latent-weighted sum), with
each token masked to the positions <= its own (causal within the row), in one online softmax. With more than one split (flash-decoding: enough programs to fill the device
at small batches, a count chosen from static shapes) each program covers an equal share of each
token's cached positions and writes a partial max, sum and accumulator, which a combine kernel
merges. Padding tokens are never written (the output is allocated zeroed).
Scores, softmax and accumulation are float32; the output has the queries' dtype.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["triton_latent_cache_write", "triton_paged_latent_attention"]

_BLOCK_H = 16  # most query heads per program
_TILE_ROWS = 64  # dot rows (tokens x heads) of a multi-token tile (half that for a latent of 256 or more)
_BLOCK_N = 32  # cached positions per inner iteration
_MIN_SPLIT_TOKENS = 256  # shortest useful context split
_MAX_SPLITS = 32


@triton.jit
def _latent_write_kernel(latent_cache_ptr, rope_cache_ptr, latent_ptr, rope_ptr, slot_ptr,
                         stride_lp, stride_lt, stride_rp, stride_rt, stride_l, stride_r,
                         LATENT_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_C: tl.constexpr,
                         BLOCK_R: tl.constexpr, PAGE_TOKENS: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        page = slot // PAGE_TOKENS
        offset = slot % PAGE_TOKENS
        c = tl.arange(0, BLOCK_C)
        latent = tl.load(latent_ptr + token * stride_l + c, mask=c < LATENT_DIM)
        tl.store(latent_cache_ptr + page * stride_lp + offset * stride_lt + c, latent, mask=c < LATENT_DIM)
        r = tl.arange(0, BLOCK_R)
        rope = tl.load(rope_ptr + token * stride_r + r, mask=r < ROPE_DIM)
        tl.store(rope_cache_ptr + page * stride_rp + offset * stride_rt + r, rope, mask=r < ROPE_DIM)


def triton_latent_cache_write(latent_cache: torch.Tensor, rope_cache: torch.Tensor, latent: torch.Tensor,
                              rope: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """``helios::latent_cache_write`` (arguments already validated). One program per token."""
    num_tokens, latent_dim = latent.shape
    if num_tokens == 0:
        return
    latent, rope = latent.contiguous(), rope.contiguous()
    with _on_device(latent_cache):
        _latent_write_kernel[(num_tokens,)](
            latent_cache, rope_cache, latent, rope, slot_mapping.contiguous(),
            latent_cache.stride(0), latent_cache.stride(1), rope_cache.stride(0), rope_cache.stride(1),
            latent.stride(0), rope.stride(0), LATENT_DIM=latent_dim, ROPE_DIM=rope.shape[1],
            BLOCK_C=triton.next_power_of_2(latent_dim), BLOCK_R=triton.next_power_of_2(rope.shape[1]),
            PAGE_TOKENS=latent_cache.shape[1])


@triton.jit
def _find_tile_row(query_start_ptr, num_rows, block, BLOCK_T: tl.constexpr):
    """The row of query tile `block`: the largest row r with query_start[r] // BLOCK_T + r <= block
    (row r's tiles are numbered from that key on; the keys never decrease)."""
    lo = tl.program_id(0) * 0
    hi = lo + num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        go_right = tl.load(query_start_ptr + mid) // BLOCK_T + mid <= block
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
    return lo - 1


@triton.jit
def _latent_attention_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, q_latent_ptr, q_rope_ptr,
                             latent_cache_ptr, rope_cache_ptr, page_table_ptr, query_start_ptr, positions_ptr,
                             scale, num_heads, max_pages, num_rows,
                             stride_qt, stride_qh, stride_rt, stride_rh, stride_ot, stride_oh,
                             stride_lp, stride_lt, stride_cp, stride_ct, stride_pt,
                             LATENT_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_C: tl.constexpr,
                             BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_N: tl.constexpr, PAGE_TOKENS: tl.constexpr, NUM_SPLITS: tl.constexpr,
                             DOT_PRECISION: tl.constexpr):
    """Program (query tile, head block, split): up to BLOCK_T consecutive tokens of one row x BLOCK_H
    heads, the M = BLOCK_T * BLOCK_H rows of every dot. Each cached block is loaded once for the
    whole tile; token t sees the positions <= positions[t] (causal within the row)."""
    block = tl.program_id(0)
    split = tl.program_id(2)
    row = _find_tile_row(query_start_ptr, num_rows, block, BLOCK_T)
    row_start = tl.load(query_start_ptr + row)
    row_end = tl.load(query_start_ptr + row + 1)
    first = row_start + (block - row_start // BLOCK_T - row) * BLOCK_T
    if first < row_end:
        m = tl.arange(0, BLOCK_T * BLOCK_H)
        token = (first + m // BLOCK_H).to(tl.int64)
        heads = tl.program_id(1) * BLOCK_H + m % BLOCK_H
        token_ok = token < row_end
        m_ok = token_ok & (heads < num_heads)
        c = tl.arange(0, BLOCK_C)
        r = tl.arange(0, BLOCK_R)
        c_mask = c < LATENT_DIM
        r_mask = r < ROPE_DIM
        position = tl.load(positions_ptr + token, mask=token_ok, other=-1)
        # This split's share of the tile's cached positions (up to its last token's), whole BLOCK_N blocks.
        seen = tl.max(position) + 1
        span = tl.cdiv(tl.cdiv(seen, NUM_SPLITS), BLOCK_N) * BLOCK_N
        begin = split * span
        end = tl.minimum(begin + span, seen)
        q_latent = tl.load(q_latent_ptr + token[:, None] * stride_qt + heads[:, None] * stride_qh + c[None, :],
                           mask=m_ok[:, None] & c_mask[None, :], other=0.0)
        q_rope = tl.load(q_rope_ptr + token[:, None] * stride_rt + heads[:, None] * stride_rh + r[None, :],
                         mask=m_ok[:, None] & r_mask[None, :], other=0.0)
        # A finite start: a token with nothing visible in this split keeps weight 0 (never NaN).
        best = tl.full((BLOCK_T * BLOCK_H,), -1e30, tl.float32)
        total = tl.zeros((BLOCK_T * BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_T * BLOCK_H, BLOCK_C), tl.float32)
        for start in range(begin, end, BLOCK_N):
            cached = start + tl.arange(0, BLOCK_N)
            page_index = cached // PAGE_TOKENS
            loaded = (cached < end) & (page_index < max_pages)
            page = tl.load(page_table_ptr + row * stride_pt + page_index, mask=loaded, other=0).to(tl.int64)
            offset = cached % PAGE_TOKENS
            latent = tl.load(latent_cache_ptr + page[:, None] * stride_lp + offset[:, None] * stride_lt + c[None, :],
                             mask=loaded[:, None] & c_mask[None, :], other=0.0)
            rope = tl.load(rope_cache_ptr + page[:, None] * stride_cp + offset[:, None] * stride_ct + r[None, :],
                           mask=loaded[:, None] & r_mask[None, :], other=0.0)
            scores = tl.dot(q_latent, tl.trans(latent), input_precision=DOT_PRECISION)
            scores += tl.dot(q_rope, tl.trans(rope), input_precision=DOT_PRECISION)
            visible = loaded[None, :] & (cached[None, :] <= position[:, None])
            scores = tl.where(visible, scores * (scale * 1.4426950408889634), float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            weights = tl.exp2(scores - new_best[:, None])
            alpha = tl.exp2(best - new_best)
            total = total * alpha + tl.sum(weights, 1)
            acc = acc * alpha[:, None] + tl.dot(weights.to(latent.dtype), latent, input_precision=DOT_PRECISION)
            best = new_best
        if NUM_SPLITS == 1:
            result = acc / tl.where(total == 0.0, 1.0, total)[:, None]
            tl.store(out_ptr + token[:, None] * stride_ot + heads[:, None] * stride_oh + c[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & c_mask[None, :])
        else:  # partial max, sum and unnormalised accumulator of this split: [T, H, S] and [T, H, S, C]
            part = (token * num_heads + heads) * NUM_SPLITS + split
            tl.store(part_m_ptr + part, best, mask=m_ok)
            tl.store(part_l_ptr + part, total, mask=m_ok)
            tl.store(part_o_ptr + part[:, None] * LATENT_DIM + c[None, :], acc, mask=m_ok[:, None] & c_mask[None, :])


@triton.jit
def _latent_combine_kernel(out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, query_start_ptr, num_rows, num_heads,
                           stride_ot, stride_oh, LATENT_DIM: tl.constexpr, BLOCK_C: tl.constexpr,
                           NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the splits of one (token, head); padding tokens (past query_start[R]) stay zero."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    if token < tl.load(query_start_ptr + num_rows):
        s = tl.arange(0, BLOCK_S)
        c = tl.arange(0, BLOCK_C)
        part = (token * num_heads + head) * NUM_SPLITS + s
        best = tl.load(part_m_ptr + part, mask=s < NUM_SPLITS, other=float("-inf"))
        total = tl.load(part_l_ptr + part, mask=s < NUM_SPLITS, other=0.0)
        acc = tl.load(part_o_ptr + part[:, None] * LATENT_DIM + c[None, :],
                      mask=(s < NUM_SPLITS)[:, None] & (c < LATENT_DIM)[None, :], other=0.0)
        overall = tl.max(best, 0)
        scale = tl.where(best > -1e30, tl.exp2(best - overall), 0.0)  # -1e30: nothing seen in that split
        result = tl.sum(acc * scale[:, None], 0) / tl.sum(total * scale, 0)
        tl.store(out_ptr + token * stride_ot + head * stride_oh + c, result.to(out_ptr.dtype.element_ty),
                 mask=c < LATENT_DIM)


def latent_splits(num_rows: int, head_blocks: int, max_context: int, device: torch.device) -> int:
    """Context splits of a launch, from static shapes only: enough programs to fill the device
    (two per multiprocessor), no split shorter than _MIN_SPLIT_TOKENS positions, at most _MAX_SPLITS."""
    processors = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    wanted = -(-2 * processors // max(1, num_rows * head_blocks))
    return max(1, min(wanted, max_context // _MIN_SPLIT_TOKENS, _MAX_SPLITS))


def latent_tiles(num_tokens: int, num_rows: int, num_heads: int, latent_dim: int) -> tuple[int, int]:
    """(BLOCK_H heads, BLOCK_T query tokens) of a launch, from static shapes: up to 16 heads per
    program; one token per tile when every row may hold one token (T <= R: decode), else as many of a
    row's tokens as keep the tile at _TILE_ROWS dot rows (fewer for a wide latent: the float32
    accumulator is [rows, C]); at least 16 rows (tl.dot's minimum M)."""
    block_h = min(_BLOCK_H, triton.next_power_of_2(num_heads))
    rows = _TILE_ROWS if latent_dim < 256 else _TILE_ROWS // 2
    block_t = 1 if num_tokens <= num_rows else max(1, rows // block_h)
    return block_h, max(block_t, 16 // block_h)


def triton_paged_latent_attention(q_latent: torch.Tensor, q_rope: torch.Tensor, latent_cache: torch.Tensor,
                                  rope_cache: torch.Tensor, page_table: torch.Tensor, query_start: torch.Tensor,
                                  positions: torch.Tensor, scale: float, *, split: int | None = None,
                                  block_t: int | None = None) -> torch.Tensor:
    """``helios::paged_latent_attention`` (arguments already validated): grid (query tiles, head
    blocks, splits), then a combine kernel when the cached positions are split (`split` overrides the
    count, `block_t` the tokens per tile)."""
    num_tokens, num_heads, latent_dim = q_latent.shape
    out = torch.zeros_like(q_latent)
    num_rows = page_table.shape[0]
    if num_tokens == 0 or num_rows == 0:
        return out
    q_latent, q_rope = q_latent.contiguous(), q_rope.contiguous()
    page_table = page_table if page_table.stride(1) == 1 else page_table.contiguous()
    query_start = query_start.contiguous()
    block_h, tile = latent_tiles(num_tokens, num_rows, num_heads, latent_dim)
    tile = max(block_t or tile, 16 // block_h)
    head_blocks = triton.cdiv(num_heads, block_h)
    splits = split or latent_splits(num_rows, head_blocks, page_table.shape[1] * latent_cache.shape[1], q_latent.device)
    parts = (torch.empty((num_tokens, num_heads, splits), dtype=torch.float32, device=q_latent.device),
             torch.empty((num_tokens, num_heads, splits), dtype=torch.float32, device=q_latent.device),
             torch.empty((num_tokens, num_heads, splits, latent_dim), dtype=torch.float32, device=q_latent.device))
    block_c = max(16, triton.next_power_of_2(latent_dim))
    with _on_device(q_latent):
        _latent_attention_kernel[(num_tokens // tile + num_rows, head_blocks, splits)](
            out, *parts, q_latent, q_rope, latent_cache, rope_cache, page_table, query_start,
            positions.contiguous(), scale, num_heads, page_table.shape[1], num_rows,
            q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1), out.stride(0), out.stride(1),
            latent_cache.stride(0), latent_cache.stride(1), rope_cache.stride(0), rope_cache.stride(1),
            page_table.stride(0), LATENT_DIM=latent_dim, ROPE_DIM=q_rope.shape[2], BLOCK_C=block_c,
            BLOCK_R=max(16, triton.next_power_of_2(q_rope.shape[2])), BLOCK_H=block_h, BLOCK_T=tile,
            BLOCK_N=_BLOCK_N, PAGE_TOKENS=latent_cache.shape[1], NUM_SPLITS=splits,
            DOT_PRECISION="ieee" if q_latent.dtype == torch.float32 else "tf32",
            num_warps=8 if block_c >= 256 else 4, num_stages=2)
        if splits > 1:
            _latent_combine_kernel[(num_tokens, num_heads)](
                out, *parts, query_start, num_rows, num_heads, out.stride(0), out.stride(1),
                LATENT_DIM=latent_dim, BLOCK_C=triton.next_power_of_2(latent_dim), NUM_SPLITS=splits,
                BLOCK_S=triton.next_power_of_2(splits), num_warps=4)
    return out


def _on_device(tensor: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()

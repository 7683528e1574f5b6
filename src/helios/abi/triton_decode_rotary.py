"""The rotary prologue of the decode kernel (`helios.abi.triton_decode`, ``ROTARY``): the query heads
rotated as they are loaded, and this step's keys (rotated) and values written to the cache by the
programs that read them. Triton device functions only; CUDA, or the CPU under TRITON_INTERPRET=1.

Semantics: exactly ``helios::rotary_cache_write`` followed by the attention op (see
`helios.abi.rotary_attention`), with the same roundings as `helios.abi.triton_fused._rotate`
(x * cos and rotate_half(x) * sin each rounded to the dtype, then their sum), so the rotated query
and the cached keys are bit for bit those of the two-kernel sequence.

Who writes what: the program (token t, key/value heads, run [lo, hi)) writes, for its own key/value
heads, every token of t's row whose position lies in [lo, hi) (in a decode batch: t itself, by the
run that holds t's position), then a block barrier orders those stores before the walk reads them
(global stores of a block are visible to the block after the barrier). A position of this step is
thus always written by the program that reads it; two programs that write one entry write the same
bytes. Tokens outside the rows (padding) are written by their split-0 program when their slot is
not negative, as ``helios::cache_write`` does.

`l2_prefetch` is the kernel's other optional prologue: extra programs that only ask the L2 cache to
fetch slices of a tensor the step reads next (Hopper's bulk L2 prefetch), so that the latency-bound
attention of a small batch overlaps the next projection's weight reads. It reads nothing into
registers and writes nothing: results do not depend on it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from helios.abi.triton_fused import _rotate

__all__ = ["l2_prefetch", "rope_table", "rotated_heads", "write_token", "write_row_tokens"]


@triton.jit
def rope_table(cos_ptr, sin_ptr, stride_ct, stride_st, token, offs_d, HEAD_DIM: tl.constexpr):
    """(cos, sin, partner, sign) of `token`: its float32 cos and sin rows [BLOCK_D], the rotate_half
    partner of each dimension and its sign."""
    d_ok = offs_d < HEAD_DIM
    cos = tl.load(cos_ptr + token * stride_ct + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_st + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    half = HEAD_DIM // 2
    partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
    sign = tl.where(offs_d < half, -1.0, 1.0)
    return cos, sin, partner, sign


@triton.jit
def rotated_heads(base, head_stride, rows, inside, table, offs_d):
    """Rows [len(rows), BLOCK_D] at base + rows * head_stride (unit stride along D) rotated by `table`
    (`rope_table`), rounded as the torch reference; masked entries are zero."""
    cos, sin, partner, sign = table
    return _rotate(base, head_stride, rows, inside, cos, sin, offs_d, partner, sign)


@triton.jit
def write_token(k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh, cos_ptr, sin_ptr, stride_ct,
                stride_st, slot_ptr, k_ptr, v_ptr, kv_strides, t, kv_head, num_kv_heads, offs_d,
                HEAD_DIM: tl.constexpr, PAGE_TOKENS: tl.constexpr, BLOCK_KV: tl.constexpr, KV_PAD: tl.constexpr):
    """Token t's keys (rotated) and values of the key/value heads [kv_head, kv_head + BLOCK_KV) into
    its cache slot, unless the slot is negative."""
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        rows = tl.arange(0, KV_PAD)
        heads = kv_head + rows
        inside = ((rows < BLOCK_KV) & (heads < num_kv_heads))[:, None] & (offs_d < HEAD_DIM)[None, :]
        table = rope_table(cos_ptr, sin_ptr, stride_ct, stride_st, t, offs_d, HEAD_DIM)
        keys = rotated_heads(k_new_ptr + t * stride_knt + kv_head * stride_knh, stride_knh, rows, inside, table, offs_d)
        values = tl.load(v_new_ptr + t * stride_vnt + heads[:, None] * stride_vnh + offs_d[None, :], mask=inside,
                         other=0.0)
        page, offset = slot // PAGE_TOKENS, slot % PAGE_TOKENS
        k_at = k_ptr + page * kv_strides[0] + offset * kv_strides[1] + heads[:, None] * kv_strides[2] \
            + offs_d[None, :] * kv_strides[3]
        v_at = v_ptr + page * kv_strides[4] + offset * kv_strides[5] + heads[:, None] * kv_strides[6] \
            + offs_d[None, :] * kv_strides[7]
        tl.store(k_at, keys, mask=inside)
        tl.store(v_at, values, mask=inside)


@triton.jit
def write_row_tokens(rotary, query_start_ptr, positions_ptr, row, lo, hi, k_ptr, v_ptr, kv_strides, kv_head,
                     num_kv_heads, offs_d, HEAD_DIM: tl.constexpr, PAGE_TOKENS: tl.constexpr,
                     BLOCK_KV: tl.constexpr, KV_PAD: tl.constexpr):
    """Every token of `row` whose position lies in [lo, hi) written (`write_token`), then the block
    barrier that orders the stores before this program's reads. rotary: the kernel's rotary
    arguments (k, v, their token and head strides, cos, sin, their token strides, slots)."""
    start = tl.load(query_start_ptr + row)
    end = tl.load(query_start_ptr + row + 1)
    for t in range(start, end):
        pos = tl.load(positions_ptr + t).to(tl.int32)
        if (pos >= lo) & (pos < hi):
            write_token(rotary[0], rotary[1], rotary[2], rotary[3], rotary[4], rotary[5], rotary[6], rotary[7],
                        rotary[8], rotary[9], rotary[10], k_ptr, v_ptr, kv_strides, t, kv_head,
                        num_kv_heads, offs_d, HEAD_DIM, PAGE_TOKENS, BLOCK_KV, KV_PAD)
    tl.debug_barrier()


# One bulk L2 prefetch by the program's first thread (a scalar's asm runs in every thread otherwise).
_PREFETCH_ASM = tl.constexpr("""{
    .reg .pred first;
    .reg .u32 thread;
    mov.u32 thread, %tid.x;
    setp.eq.u32 first, thread, 0;
    @first cp.async.bulk.prefetch.L2.global [$1], $2;
    mov.u32 $0, 0;
}""")


@triton.jit
def l2_prefetch(prefetch_ptr, total_bytes, chunk_bytes, row):
    """Prefetch program `row` (of the rows past the tokens) x (its program ids 1 and 2): one bulk L2
    prefetch of its chunk_bytes slice of [prefetch_ptr, prefetch_ptr + total_bytes) (both multiples of
    16, as the instruction needs), nothing past the end."""
    index = (row * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
    start = index * chunk_bytes
    if start < total_bytes:
        size = tl.minimum(chunk_bytes, total_bytes - start).to(tl.int32)
        base = prefetch_ptr.to(tl.pointer_type(tl.int8)) + start
        tl.inline_asm_elementwise(_PREFETCH_ASM, "=r,l,r", [base, size], dtype=tl.int32, is_pure=False, pack=1)

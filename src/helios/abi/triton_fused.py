"""Triton kernels of the fused decoder ops of `helios.abi.fused` (CUDA; CPU under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.fused`. Each kernel computes in float32 and
rounds to the tensor dtype exactly where the reference's torch ops round (after each op), so only a
reduction's order (the norm's sum of squares) or a libdevice function (exp, rsqrt) can move a
result by the last bit. Launch grids and block sizes depend on shapes only; nothing reads device
data on the host, so the kernels can be captured in a CUDA graph.

- `triton_rms_norm`: one program per row (the whole row in one block), optionally adding the
  residual delta first and storing the sum;
- `triton_silu_mul`: one program per (row, block of F columns); a column-major gate_up (the
  transpose of a [2F, N] product) one program per [rows x columns] block, read along the rows;
- `triton_rotary_cache_write`: one program per packed token: q's and k's heads rotated, q stored,
  k and v stored at the token's cache slot (padding tokens, slot < 0, write no cache entry), and,
  for attention over the step's own keys, the rotated k and v as dense [T, Hkv, D] tensors too;
- `triton_zero_outside_rows`: zeros for the padding tokens of an attention output, one program per
  block of tokens, which returns at once when its tokens all lie inside the rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from helios.abi.dependent_launch import dependent_launch

__all__ = ["triton_rms_norm", "triton_rotary_cache_write", "triton_silu_mul", "triton_zero_outside_rows"]

_SILU_BLOCK = 1024
_COLUMNS_ROWS, _COLUMNS_COLS = 64, 64  # the column-major silu_mul's [rows, columns] block
_HEAD_BLOCK = 8  # heads rotated per loop iteration of a rotary program
_ZERO_TOKENS, _ZERO_WIDTH = 16, 512  # a padding-zeroing program's [tokens, columns] block


@triton.jit
def _rms_norm_kernel(x, x_stride, delta, delta_stride, weight, summed, normed, width, eps,
                     HAS_DELTA: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    if PDL:  # under programmatic dependent launch: the next kernel may start; wait for the previous
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    cols = tl.arange(0, BLOCK_D)
    inside = cols < width
    values = tl.load(x + row * x_stride + cols, mask=inside, other=0.0)
    if HAS_DELTA:  # the residual update, rounded to the dtype like a torch add
        added = tl.load(delta + row * delta_stride + cols, mask=inside, other=0.0)
        values = (values.to(tl.float32) + added.to(tl.float32)).to(summed.dtype.element_ty)
        tl.store(summed + row * width + cols, values, mask=inside)
    wide = values.to(tl.float32)
    mean = tl.sum(wide * wide, axis=0) / width
    scaled = (wide * tl.math.rsqrt(mean + eps)).to(normed.dtype.element_ty)
    gain = tl.load(weight + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(normed + row * width + cols, (gain * scaled.to(tl.float32)).to(normed.dtype.element_ty), mask=inside)


def triton_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                    eps: float, *, pdl: bool | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(x + delta or None, rms_norm of it) over the last dimension; x and weight of one dtype.
    `pdl` (default: where `helios.abi.dependent_launch` says) launches it with programmatic
    dependent launch."""
    width = x.shape[-1]
    rows = x.reshape(-1, width)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    normed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device) if delta is not None else None
    added = rows
    if delta is not None:
        added = delta.reshape(-1, width)
        added = added if added.stride(-1) == 1 else added.contiguous()
    block = triton.next_power_of_2(width)
    warps = max(1, min(16, block // 256))
    pdl = dependent_launch(x) if pdl is None else pdl
    _rms_norm_kernel[(rows.shape[0],)](
        rows, rows.stride(0), added, added.stride(0), weight.contiguous(),
        summed if summed is not None else normed, normed, width, eps,
        HAS_DELTA=delta is not None, BLOCK_D=block, PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )
    return summed, normed


@triton.jit
def _silu_mul_kernel(gate_up, stride, out, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    gate = tl.load(gate_up + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gate_up + row * stride + width + cols, mask=inside, other=0.0).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(out.dtype.element_ty)  # silu, rounded like torch's
    tl.store(out + row * width + cols, (activated.to(tl.float32) * up).to(out.dtype.element_ty), mask=inside)


@triton.jit
def _silu_mul_columns_kernel(gate_up, column_stride, out, num_rows, width, BLOCK_R: tl.constexpr,
                             BLOCK_C: tl.constexpr):
    """silu_mul of a column-major gate_up (row r, column c at ``c * column_stride + r``: the
    transpose of a contiguous [2F, N] product): read along rows, written row-major [N, F]."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < num_rows) & (cols[None, :] < width)
    offsets = cols[None, :].to(tl.int64) * column_stride + rows[:, None]
    gate = tl.load(gate_up + offsets, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gate_up + offsets + width.to(tl.int64) * column_stride, mask=inside, other=0.0).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(out.dtype.element_ty)  # silu, rounded like torch's
    tl.store(out + rows[:, None].to(tl.int64) * width + cols[None, :],
             (activated.to(tl.float32) * up).to(out.dtype.element_ty), mask=inside)


def is_column_major(matrix: torch.Tensor) -> bool:
    """Whether a 2-D tensor is the transpose of a contiguous one (and not also row-major)."""
    return matrix.dim() == 2 and matrix.shape[0] > 1 and matrix.stride(0) == 1 and matrix.stride(1) >= matrix.shape[0]


def triton_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [N, 2F]: [N, F] in its dtype. A column-major gate_up (the
    transpose of a [2F, N] product) is read in place by the columns kernel, not copied. (Programs
    keep the row-major product: the swapped one, w @ x^T, lost at 8B shapes on the H200, 744 against
    661 us with silu_mul at 2,048 tokens, bench/prefill_kernels_ab.py.)"""
    if is_column_major(gate_up):
        num_rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((num_rows, width), dtype=gate_up.dtype, device=gate_up.device)
        _silu_mul_columns_kernel[(triton.cdiv(num_rows, _COLUMNS_ROWS), triton.cdiv(width, _COLUMNS_COLS))](
            gate_up, gate_up.stride(1), out, num_rows, width, BLOCK_R=_COLUMNS_ROWS, BLOCK_C=_COLUMNS_COLS,
            num_warps=8)
        return out
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    num_rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((num_rows, width), dtype=gate_up.dtype, device=gate_up.device)
    _silu_mul_kernel[(num_rows, triton.cdiv(width, _SILU_BLOCK))](
        gate_up, gate_up.stride(0), out, width, BLOCK=_SILU_BLOCK, num_warps=4)
    return out


@triton.jit
def _rotate(base, head_stride, block, inside, cos, sin, dims, partner, sign):
    """Rotated heads [HEAD_BLOCK, BLOCK_D] of one token, rounded like the torch reference:
    x * cos and rotate_half(x) * sin each rounded to the dtype, then their sum."""
    offsets = block[:, None] * head_stride
    values = tl.load(base + offsets + dims[None, :], mask=inside, other=0.0)
    pair = tl.load(base + offsets + partner[None, :], mask=inside, other=0.0)
    dtype = values.dtype
    turned = (pair.to(tl.float32) * sign[None, :]).to(dtype)
    straight = (values.to(tl.float32) * cos[None, :]).to(dtype)
    crossed = (turned.to(tl.float32) * sin[None, :]).to(dtype)
    return (straight.to(tl.float32) + crossed.to(tl.float32)).to(dtype)


@triton.jit
def _rotary_cache_write_kernel(
    q, q_token_stride, q_head_stride, k, k_token_stride, k_head_stride, v, v_token_stride,
    v_head_stride, cos, cos_stride, sin, sin_stride, k_cache, v_cache, slot_mapping, q_out, k_out, v_out,
    num_heads, num_kv_heads, head_dim, HEAD_BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, STORE_KV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    half = head_dim // 2
    partner = tl.where(dims < half, dims + half, dims - half)
    sign = tl.where(dims < half, -1.0, 1.0)
    in_dim = dims < head_dim
    cos_row = tl.load(cos + token * cos_stride + dims, mask=in_dim, other=0.0).to(tl.float32)
    sin_row = tl.load(sin + token * sin_stride + dims, mask=in_dim, other=0.0).to(tl.float32)
    block = tl.arange(0, HEAD_BLOCK)
    for first in range(0, num_heads, HEAD_BLOCK):
        heads = first + block
        inside = (heads[:, None] < num_heads) & in_dim[None, :]
        rotated = _rotate(q + token * q_token_stride + first * q_head_stride, q_head_stride, block, inside,
                          cos_row, sin_row, dims, partner, sign)
        tl.store(q_out + (token * num_heads + heads[:, None]) * head_dim + dims[None, :], rotated, mask=inside)
    slot = tl.load(slot_mapping + token)
    for first in range(0, num_kv_heads, HEAD_BLOCK):
        heads = first + block
        inside = (heads[:, None] < num_kv_heads) & in_dim[None, :]
        rotated = _rotate(k + token * k_token_stride + first * k_head_stride, k_head_stride, block, inside,
                          cos_row, sin_row, dims, partner, sign)
        values = tl.load(v + token * v_token_stride + heads[:, None] * v_head_stride + dims[None, :],
                         mask=inside, other=0.0)
        written = inside & (slot >= 0)  # padding tokens write no cache entry
        target = (slot * num_kv_heads + heads[:, None]) * head_dim + dims[None, :]
        tl.store(k_cache + target, rotated, mask=written)
        tl.store(v_cache + target, values, mask=written)
        if STORE_KV:  # the rotated keys and the values, every token (padding too), contiguous [T, Hkv, D]
            dense = (token * num_kv_heads + heads[:, None]) * head_dim + dims[None, :]
            tl.store(k_out + dense, rotated, mask=inside)
            tl.store(v_out + dense, values, mask=inside)


def triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, *, dense: bool = False):
    """Rotated q [T, Hq, D] (contiguous); rotated k and v written at their slots of the contiguous
    planes k_cache, v_cache [P, page_tokens, Hkv, D]. With `dense`: (rotated q, rotated k, v), k and v
    [T, Hkv, D] contiguous with the values the planes get, for attention over the step's own keys."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    num_tokens, num_heads, head_dim = q.shape
    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out, v_out = (torch.empty((num_tokens, k.shape[1], head_dim), dtype=k.dtype, device=k.device)
                    for _ in range(2)) if dense else (q_out, q_out)
    _rotary_cache_write_kernel[(num_tokens,)](
        q, q.stride(0), q.stride(1), k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1),
        cos, cos.stride(0), sin, sin.stride(0), k_cache, v_cache, slot_mapping.contiguous(), q_out, k_out, v_out,
        num_heads, k.shape[1], head_dim, HEAD_BLOCK=_HEAD_BLOCK, BLOCK_D=triton.next_power_of_2(head_dim),
        STORE_KV=dense, num_warps=4,
    )
    return (q_out, k_out, v_out) if dense else q_out


@triton.jit
def _zero_outside_rows_kernel(out, query_start, num_rows, num_tokens, width, BLOCK_T: tl.constexpr,
                              BLOCK_W: tl.constexpr):
    """Program (block of BLOCK_T tokens): zeros for its tokens outside [query_start[0], query_start[R])."""
    first = tl.program_id(0) * BLOCK_T
    start = tl.load(query_start)
    end = tl.load(query_start + num_rows)
    if (first < start) | (first + BLOCK_T > end):
        tokens = first + tl.arange(0, BLOCK_T)
        outside = ((tokens < start) | (tokens >= end)) & (tokens < num_tokens)
        rows = out + tokens[:, None].to(tl.int64) * width
        zeros = tl.zeros([BLOCK_T, BLOCK_W], out.dtype.element_ty)
        for column in range(0, width, BLOCK_W):
            columns = column + tl.arange(0, BLOCK_W)
            tl.store(rows + columns[None, :], zeros, mask=outside[:, None] & (columns < width)[None, :])


def triton_zero_outside_rows(out: torch.Tensor, query_start: torch.Tensor) -> None:
    """Writes zeros, in place, to the tokens of a contiguous [T, ...] output outside
    [query_start[0], query_start[R]) (query_start: int32 [R + 1] on its device; read on the device)."""
    num_tokens = out.shape[0]
    if num_tokens == 0:
        return
    width = out[0].numel()
    _zero_outside_rows_kernel[(triton.cdiv(num_tokens, _ZERO_TOKENS),)](
        out, query_start, query_start.shape[0] - 1, num_tokens, width, BLOCK_T=_ZERO_TOKENS, BLOCK_W=_ZERO_WIDTH,
        num_warps=4)

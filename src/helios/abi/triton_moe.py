"""Triton grouped expert GEMM of ``helios::moe_experts`` (CUDA; CPU under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.moe`. The kernels never read device data on
the host: every grid and buffer is a function of shapes, so a program calling them can be captured
into a CUDA graph. Steps (A = T * K token-expert assignments):

1. sort the assignments by expert (device ``torch.sort``; ids outside [0, E) go to a last bucket
   that is never computed), count each expert's assignments (``scatter_add``), and cut each
   expert's run into blocks of ``BLOCK_M`` rows. The grid holds a static upper bound of blocks,
   ``min(A, ceil(A / BLOCK_M) + E)``; each block's expert and row range are computed on the device
   (``searchsorted`` over the experts' cumulative block counts), blocks past the last exit at once;
2. gate/up kernel: block (expert e, its rows) x a tile of F columns: gathers the rows' token
   hidden states, multiplies by e's gate and up rows (reading only expert e's weights), adds the
   bias, applies the activation in float32 and writes the intermediate [A, F] in sorted order;
3. down kernel: block x a tile of H columns: intermediate @ down[e]^T (+ bias) times the
   assignment's routing weight, written in float32 to the assignment's own row of [A, H];
4. the K rows of each token are summed (float32, a fixed order: deterministic) and cast.

So the weights read are exactly those of the experts some token selected (each once per column
tile of its blocks). float32 inputs multiply in exact float32 (never TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["block_schedule", "triton_moe_experts"]

_ACTIVATION_CODES = {"silu": 0, "swiglu_clamped": 1}


@triton.jit
def _block_rows(block_expert, block_start, block_end, pid_m, BLOCK_M: tl.constexpr):
    expert = tl.load(block_expert + pid_m)
    start = tl.load(block_start + pid_m)
    end = tl.load(block_end + pid_m)
    rows = start + tl.arange(0, BLOCK_M)
    return expert, rows, rows < end


@triton.jit
def _gate_up_kernel(hidden, order, gate_up, gate_up_bias, inter, block_expert, block_start, block_end,
                    H, F, K, alpha, limit, stride_ht, stride_ge, stride_gn, stride_it,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert, rows, row_ok = _block_rows(block_expert, block_start, block_end, pid_m, BLOCK_M)
    if expert < 0:
        return
    tokens = tl.load(order + rows, mask=row_ok, other=0) // K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < F
    offs_k = tl.arange(0, BLOCK_K)
    weights = gate_up + expert.to(tl.int64) * stride_ge
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < H
        x = tl.load(hidden + tokens.to(tl.int64)[:, None] * stride_ht + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        w_gate = tl.load(weights + cols[None, :].to(tl.int64) * stride_gn + ks[:, None], mask=w_mask, other=0.0)
        w_up = tl.load(weights + (cols[None, :] + F).to(tl.int64) * stride_gn + ks[:, None], mask=w_mask, other=0.0)
        acc_gate += tl.dot(x, w_gate, input_precision=DOT_PRECISION)
        acc_up += tl.dot(x, w_up, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = gate_up_bias + expert.to(tl.int64) * (2 * F)
        acc_gate += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc_up += tl.load(bias + F + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == 0:
        out = acc_gate * tl.sigmoid(acc_gate) * acc_up
    else:
        gate = tl.minimum(acc_gate, limit)
        up = tl.minimum(tl.maximum(acc_up, -limit), limit)
        out = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
    tl.store(inter + rows.to(tl.int64)[:, None] * stride_it + cols[None, :], out.to(inter.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(inter, order, route_weights, down, down_bias, out, block_expert, block_start, block_end,
                 H, F, stride_it, stride_de, stride_dn, stride_ot,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert, rows, row_ok = _block_rows(block_expert, block_start, block_end, pid_m, BLOCK_M)
    if expert < 0:
        return
    assignments = tl.load(order + rows, mask=row_ok, other=0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    offs_k = tl.arange(0, BLOCK_K)
    weights = down + expert.to(tl.int64) * stride_de
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < F
        x = tl.load(inter + rows.to(tl.int64)[:, None] * stride_it + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(weights + cols[None, :].to(tl.int64) * stride_dn + ks[:, None],
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc += tl.dot(x, w, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(down_bias + expert.to(tl.int64) * H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    scale = tl.load(route_weights + assignments, mask=row_ok, other=0.0)
    tl.store(out + assignments.to(tl.int64)[:, None] * stride_ot + cols[None, :], acc * scale[:, None],
             mask=row_ok[:, None] & col_ok[None, :])


def block_m(assignments: int) -> int:
    """Rows per block: small for decode-sized batches (each expert sees a few rows), larger for prefill."""
    return 16 if assignments <= 512 else 64


def block_schedule(ids: torch.Tensor, num_experts: int, rows_per_block: int):
    """Sort assignments by expert and cut each expert's run into blocks (device ops, static shapes).

    Returns ``(order, block_expert, block_start, block_end)``: order int64 [A] the assignment index at
    each sorted position; per block (a static bound of them) its expert (-1: no work), and its
    [start, end) range of sorted positions.
    """
    flat = ids.reshape(-1)
    count = flat.shape[0]
    valid = (flat >= 0) & (flat < num_experts)
    key = torch.where(valid, flat, torch.full_like(flat, num_experts))
    order = torch.sort(key, stable=True)[1]
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    expert_start = torch.cumsum(counts, 0) - counts
    blocks = torch.div(counts + rows_per_block - 1, rows_per_block, rounding_mode="floor")
    block_end_index = torch.cumsum(blocks, 0)
    num_blocks = min(count, -(-count // rows_per_block) + num_experts)
    index = torch.arange(num_blocks, device=ids.device, dtype=torch.int64)
    expert = torch.searchsorted(block_end_index, index, right=True)
    live = expert < num_experts
    expert = expert.clamp(max=num_experts - 1)
    first_block = block_end_index[expert] - blocks[expert]
    start = expert_start[expert] + (index - first_block) * rows_per_block
    end = expert_start[expert] + counts[expert]
    block_expert = torch.where(live, expert, torch.full_like(expert, -1)).to(torch.int32)
    return order, block_expert, start.to(torch.int32), end.to(torch.int32)


def triton_moe_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation: str,
                       alpha: float, limit: float) -> torch.Tensor:
    """``helios::moe_experts`` on validated inputs (see `helios.abi.moe`)."""
    tokens, width = hidden.shape
    top_k = ids.shape[1]
    num_experts, ffn = gate_up.shape[0], gate_up.shape[1] // 2
    assignments = tokens * top_k
    if assignments == 0:
        return torch.zeros_like(hidden)
    hidden, gate_up, down = hidden.contiguous(), gate_up.contiguous(), down.contiguous()
    gate_up_bias = None if gate_up_bias is None else gate_up_bias.contiguous()
    down_bias = None if down_bias is None else down_bias.contiguous()
    rows_per_block = block_m(assignments)
    order, block_expert, block_start, block_end = block_schedule(ids, num_experts, rows_per_block)
    route = weights.reshape(-1).contiguous()
    inter = torch.empty((assignments, ffn), dtype=hidden.dtype, device=hidden.device)
    per_assignment = torch.zeros((assignments, width), dtype=torch.float32, device=hidden.device)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    num_blocks = block_expert.shape[0]
    block_n = 32 if assignments <= 64 else 64
    block_k = 64
    _gate_up_kernel[(num_blocks, triton.cdiv(ffn, block_n))](
        hidden, order, gate_up, gate_up_bias if gate_up_bias is not None else gate_up, inter,
        block_expert, block_start, block_end, width, ffn, top_k, float(alpha), float(limit),
        hidden.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        HAS_BIAS=gate_up_bias is not None, ACTIVATION=_ACTIVATION_CODES[activation], BLOCK_M=rows_per_block,
        BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=precision, num_warps=4)
    _down_kernel[(num_blocks, triton.cdiv(width, block_n))](
        inter, order, route, down, down_bias if down_bias is not None else down, per_assignment,
        block_expert, block_start, block_end, width, ffn, inter.stride(0), down.stride(0), down.stride(1),
        per_assignment.stride(0), HAS_BIAS=down_bias is not None, BLOCK_M=rows_per_block, BLOCK_N=block_n,
        BLOCK_K=block_k, DOT_PRECISION=precision, num_warps=4)
    return per_assignment.view(tokens, top_k, width).sum(dim=1).to(hidden.dtype)

"""Triton grouped expert GEMM of ``helios::moe_experts`` (CUDA; CPU under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.moe`. The kernels never read device data on
the host: every grid and buffer is a function of shapes, so a program calling them can be captured
into a CUDA graph. Steps (A = T * K token-expert assignments):

1. sort the assignments by expert (device ``torch.sort``; ids outside [0, E) go to a last bucket
   that is never computed), find each expert's run of sorted positions (``searchsorted``), and cut
   each run into blocks of ``BLOCK_M`` rows (`_schedule_kernel`; `block_schedule` is the same in
   torch ops). The grid holds a static upper bound of blocks, ``min(A, ceil(A / BLOCK_M) + E)``;
   blocks past the last exit at once;
2. gate/up kernel: block (expert e, its rows) x a tile of F columns: gathers the rows' token
   hidden states, multiplies by e's gate and up rows (reading only expert e's weights; a non-gated
   expert's up rows alone), adds the bias, applies the activation in float32 and writes the
   intermediate [A, F] in sorted order;
3. down kernel: block x a tile of H columns: intermediate @ down[e]^T (+ bias) times the
   assignment's routing weight, written in float32 to the assignment's own row of [A, H];
4. the K rows of each token are summed (float32, a fixed order: deterministic) and cast.

So the weights read are exactly those of the experts some token selected (each once per column
tile of its blocks). float32 inputs multiply in exact float32 (never TF32).

Small batches (A <= ``GEMV_ASSIGNMENTS``, decode at a few rows) skip the sort and the schedule: one
program per (assignment, column tile) reads its expert's rows and multiplies them with the token's
hidden state as a matrix-vector product (no 16-row tensor-core tile for a single row), then the same
weighted, per-assignment rows are summed. Top-k experts of one token are distinct, so at batch 1
every expert weight is read exactly once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from helios.abi.moe import expert_width
from helios.abi.moe_tiles import LaunchTiles, tiles_for

__all__ = ["block_schedule", "triton_moe_experts"]

_ACTIVATION_CODES = {"silu": 0, "swiglu_clamped": 1, "relu2": 2}  # 2: non-gated, gate_up holds the up rows only
GEMV_ASSIGNMENTS = 32


@triton.jit
def _activate(gate, up, alpha, limit, ACTIVATION: tl.constexpr):
    if ACTIVATION == 0:
        out = gate * tl.sigmoid(gate) * up
    elif ACTIVATION == 2:  # non-gated: `gate` holds the up projection
        out = tl.maximum(gate, 0.0)
        out = out * out
    else:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        out = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
    return out


@triton.jit
def _gate_up_gemv_kernel(hidden, ids, gate_up, gate_up_bias, inter, E, H, F, K, alpha, limit,
                         stride_ht, stride_ge, stride_gn, stride_it, HAS_BIAS: tl.constexpr,
                         ACTIVATION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    assignment, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(ids + assignment)
    if (expert < 0) | (expert >= E):
        return
    token = assignment // K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < F
    offs_k = tl.arange(0, BLOCK_K)
    weights = gate_up + expert * stride_ge
    acc_gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < H
        x = tl.load(hidden + token.to(tl.int64) * stride_ht + ks, mask=k_ok, other=0.0).to(tl.float32)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w_gate = tl.load(weights + cols[:, None].to(tl.int64) * stride_gn + ks[None, :], mask=w_mask, other=0.0)
        acc_gate += tl.sum(w_gate.to(tl.float32) * x[None, :], axis=1)
        if ACTIVATION != 2:
            w_up = tl.load(weights + (cols[:, None] + F).to(tl.int64) * stride_gn + ks[None, :], mask=w_mask,
                           other=0.0)
            acc_up += tl.sum(w_up.to(tl.float32) * x[None, :], axis=1)
    if HAS_BIAS:
        bias = gate_up_bias + expert * (F if ACTIVATION == 2 else 2 * F)
        acc_gate += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)
        if ACTIVATION != 2:
            acc_up += tl.load(bias + F + cols, mask=col_ok, other=0.0).to(tl.float32)
    out = _activate(acc_gate, acc_up, alpha, limit, ACTIVATION)
    tl.store(inter + assignment.to(tl.int64) * stride_it + cols, out.to(inter.dtype.element_ty), mask=col_ok)


@triton.jit
def _down_gemv_kernel(inter, ids, route_weights, down, down_bias, out, E, H, F, stride_it, stride_de, stride_dn,
                      stride_ot, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    assignment, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(ids + assignment)
    if (expert < 0) | (expert >= E):
        return
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    offs_k = tl.arange(0, BLOCK_K)
    weights = down + expert * stride_de
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < F
        x = tl.load(inter + assignment.to(tl.int64) * stride_it + ks, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(weights + cols[:, None].to(tl.int64) * stride_dn + ks[None, :],
                    mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(down_bias + expert * H + cols, mask=col_ok, other=0.0).to(tl.float32)
    scale = tl.load(route_weights + assignment)
    tl.store(out + assignment.to(tl.int64) * stride_ot + cols, acc * scale, mask=col_ok)


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
        acc_gate += tl.dot(x, w_gate, input_precision=DOT_PRECISION)
        if ACTIVATION != 2:
            w_up = tl.load(weights + (cols[None, :] + F).to(tl.int64) * stride_gn + ks[:, None], mask=w_mask,
                           other=0.0)
            acc_up += tl.dot(x, w_up, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = gate_up_bias + expert.to(tl.int64) * (F if ACTIVATION == 2 else 2 * F)
        acc_gate += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if ACTIVATION != 2:
            acc_up += tl.load(bias + F + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = _activate(acc_gate, acc_up, alpha, limit, ACTIVATION)
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


@triton.jit
def _schedule_kernel(bounds, block_expert, block_start, block_end, num_blocks, E, ROWS: tl.constexpr,
                     BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """One program: from each expert's [start, end) run of sorted positions (``bounds``), every block's
    expert (-1 past the last block) and row range; a block's expert is the run its index falls in."""
    experts = tl.arange(0, BLOCK_E)
    ok = experts < E
    lo = tl.load(bounds + experts, mask=ok, other=0).to(tl.int32)
    hi = tl.load(bounds + experts + 1, mask=ok, other=0).to(tl.int32)
    blocks = (hi - lo + ROWS - 1) // ROWS
    ends = tl.cumsum(blocks, axis=0)
    firsts = ends - blocks
    total = tl.sum(blocks, axis=0)
    for b0 in range(0, num_blocks, CHUNK):
        index = b0 + tl.arange(0, CHUNK)
        owner = (firsts[None, :] <= index[:, None]) & (index[:, None] < ends[None, :]) & ok[None, :]
        expert = tl.sum(tl.where(owner, experts[None, :], 0), axis=1)
        first = tl.sum(tl.where(owner, firsts[None, :], 0), axis=1)
        start = tl.sum(tl.where(owner, lo[None, :], 0), axis=1) + (index - first) * ROWS
        end = tl.sum(tl.where(owner, hi[None, :], 0), axis=1)
        inside = index < num_blocks
        tl.store(block_expert + index, tl.where(index < total, expert, -1), mask=inside)
        tl.store(block_start + index, start, mask=inside)
        tl.store(block_end + index, end, mask=inside)


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


def device_block_schedule(ids: torch.Tensor, num_experts: int, rows_per_block: int):
    """`block_schedule`'s results in five launches: the sort, one binary search of every expert's run
    in the sorted keys, and `_schedule_kernel` (blocks past the last carry expert -1 and rows 0..0)."""
    flat = ids.reshape(-1)
    count = flat.shape[0]
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    sorted_key, order = torch.sort(key, stable=True)
    experts = torch.arange(num_experts + 1, device=ids.device, dtype=sorted_key.dtype)
    bounds = torch.searchsorted(sorted_key, experts)
    num_blocks = min(count, -(-count // rows_per_block) + num_experts)
    block_expert, block_start, block_end = (torch.empty(num_blocks, dtype=torch.int32, device=ids.device)
                                            for _ in range(3))
    _schedule_kernel[(1,)](bounds, block_expert, block_start, block_end, num_blocks, num_experts,
                           ROWS=rows_per_block, BLOCK_E=triton.next_power_of_2(num_experts), CHUNK=32, num_warps=4)
    return order, block_expert, block_start, block_end


def triton_moe_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation: str,
                       alpha: float, limit: float, tiles: LaunchTiles | None = None) -> torch.Tensor:
    """``helios::moe_experts`` on validated inputs (see `helios.abi.moe`). `tiles` overrides the
    tuned table's (`helios.abi.moe_tiles`) choice for this shape (the tuning script sweeps them)."""
    tokens, width = hidden.shape
    top_k = ids.shape[1]
    num_experts, ffn = gate_up.shape[0], expert_width(gate_up, activation)
    assignments = tokens * top_k
    if assignments == 0:
        return torch.zeros_like(hidden)
    hidden, gate_up, down = hidden.contiguous(), gate_up.contiguous(), down.contiguous()
    gate_up_bias = None if gate_up_bias is None else gate_up_bias.contiguous()
    down_bias = None if down_bias is None else down_bias.contiguous()
    route = weights.reshape(-1).contiguous()
    inter = torch.empty((assignments, ffn), dtype=hidden.dtype, device=hidden.device)
    per_assignment = torch.zeros((assignments, width), dtype=torch.float32, device=hidden.device)
    biases = (gate_up_bias, down_bias)
    path = "gemv" if assignments <= GEMV_ASSIGNMENTS else "grouped"
    if tiles is None:
        tiles = tiles_for(path, assignments, num_experts, width, ffn, gate_up.dtype)
    if path == "gemv":
        _gemv_experts(hidden, ids.reshape(-1).contiguous(), route, (gate_up, down), biases, inter, per_assignment,
                      (activation, alpha, limit), tiles)
        return per_assignment.view(tokens, top_k, width).sum(dim=1).to(hidden.dtype)
    _grouped_experts(hidden, ids, route, (gate_up, down), biases, inter, per_assignment, (activation, alpha, limit),
                     tiles)
    return per_assignment.view(tokens, top_k, width).sum(dim=1).to(hidden.dtype)


def _grouped_experts(hidden, ids, route, experts, biases, inter, out, activation, tiles: LaunchTiles) -> None:
    """The sorted block GEMM path (module docstring, steps 1-3)."""
    (gate_up, down), (gate_up_bias, down_bias) = experts, biases
    (activation, alpha, limit), width, ffn, top_k = activation, hidden.shape[1], inter.shape[1], ids.shape[1]
    num_experts = gate_up.shape[0]
    order, block_expert, block_start, block_end = device_block_schedule(ids, num_experts, tiles.gate_up.block_m)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    num_blocks = block_expert.shape[0]
    up, dn = tiles.gate_up, tiles.down
    _gate_up_kernel[(num_blocks, triton.cdiv(ffn, up.block_n))](
        hidden, order, gate_up, gate_up_bias if gate_up_bias is not None else gate_up, inter,
        block_expert, block_start, block_end, width, ffn, top_k, float(alpha), float(limit),
        hidden.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        HAS_BIAS=gate_up_bias is not None, ACTIVATION=_ACTIVATION_CODES[activation], BLOCK_M=up.block_m,
        BLOCK_N=up.block_n, BLOCK_K=up.block_k, DOT_PRECISION=precision, num_warps=up.num_warps,
        num_stages=up.num_stages)
    _down_kernel[(num_blocks, triton.cdiv(width, dn.block_n))](
        inter, order, route, down, down_bias if down_bias is not None else down, out,
        block_expert, block_start, block_end, width, ffn, inter.stride(0), down.stride(0), down.stride(1),
        out.stride(0), HAS_BIAS=down_bias is not None, BLOCK_M=up.block_m, BLOCK_N=dn.block_n,
        BLOCK_K=dn.block_k, DOT_PRECISION=precision, num_warps=dn.num_warps, num_stages=dn.num_stages)


def _gemv_experts(hidden, ids, route, experts, biases, inter, out, activation, tiles: LaunchTiles) -> None:
    """The small-batch path: one program per (assignment, column tile), no sort (module docstring)."""
    gate_up, down = experts
    gate_up_bias, down_bias = biases
    activation, alpha, limit = activation
    assignments, (num_experts, _, width) = ids.shape[0], gate_up.shape
    ffn, up, dn = expert_width(gate_up, activation), tiles.gate_up, tiles.down
    top_k = assignments // hidden.shape[0]
    _gate_up_gemv_kernel[(assignments, triton.cdiv(ffn, up.block_n))](
        hidden, ids, gate_up, gate_up_bias if gate_up_bias is not None else gate_up, inter, num_experts, width, ffn,
        top_k, float(alpha), float(limit), hidden.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        HAS_BIAS=gate_up_bias is not None, ACTIVATION=_ACTIVATION_CODES[activation], BLOCK_N=up.block_n,
        BLOCK_K=up.block_k, num_warps=up.num_warps, num_stages=up.num_stages)
    _down_gemv_kernel[(assignments, triton.cdiv(width, dn.block_n))](
        inter, ids, route, down, down_bias if down_bias is not None else down, out, num_experts, width, ffn,
        inter.stride(0), down.stride(0), down.stride(1), out.stride(0), HAS_BIAS=down_bias is not None,
        BLOCK_N=dn.block_n, BLOCK_K=dn.block_k, num_warps=dn.num_warps, num_stages=dn.num_stages)

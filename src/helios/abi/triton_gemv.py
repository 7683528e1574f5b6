"""A Triton matrix-vector product for the projections of a one-row decode step (CUDA; CPU under
TRITON_INTERPRET=1), used where a committed table says it beats cuBLAS.

At batch 1 a decode step is its weight reads: ``y = x @ W.T`` with x one row. cuBLAS picks its GEMV
or split-K GEMM per shape; on an H200 at Llama-3.1-8B shapes a plain split-row kernel (each program
BLOCK_N output features, the whole reduction in BLOCK_K slices, float32 sums) reads the fused qkv
and the output projection's weights faster than cuBLAS does, and the MLP's not
(`bench/gemv_ab.py`, `bench/decode_step_profile.py`). `helios.abi.gemv_tiles.GEMV_TILES` holds the
(out features, in features) pairs measured faster and the tile for each; `gemv_tile` is the choice
the runtime makes at capture (`helios.runtime.loading.gemv_calls`), from static shapes only. `gemv_linear` computes
``F.linear`` for any input: rows past `MAX_ROWS`, another device, dtype or shape go to ``F.linear``
itself, so a graph bound to it stays exact for every call.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from helios.abi.gemv_tiles import GemvTile, gemv_tile
from helios.abi.triton_paged import on_device

__all__ = ["gemv", "gemv_linear"]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, num_out, depth, stride_xr, stride_wn, stride_or,
                 ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]) for this program's BLOCK_N features n, every
    row r < ROWS (float32 sums, one rounding to the output dtype)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = cols < num_out
    rows_at = w_ptr + cols[:, None].to(tl.int64) * stride_wn
    for row in tl.static_range(ROWS):
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, depth, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            k_ok = ks < depth
            tile = tl.load(rows_at + ks[None, :], mask=inside[:, None] & k_ok[None, :], other=0.0)
            vector = tl.load(x_ptr + row * stride_xr + ks, mask=k_ok, other=0.0)
            acc += tl.sum(tile.to(tl.float32) * vector.to(tl.float32)[None, :], axis=1)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_or + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         tile: GemvTile | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by the Triton kernel, for x [..., K] of a few rows (the weights
    are read once per row) and a contiguous-row weight [N, K]."""
    tile = tile or GemvTile()
    depth, num_out = x.shape[-1], weight.shape[0]
    flat = x.reshape(-1, depth)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    out = torch.empty((rows, num_out), dtype=x.dtype, device=x.device)
    if rows and num_out:
        weight = weight if weight.stride(-1) == 1 else weight.contiguous()
        with on_device(x):
            _gemv_kernel[(triton.cdiv(num_out, tile.block_n),)](
                flat, weight, weight if bias is None else bias, out, num_out, depth, flat.stride(0),
                weight.stride(0), out.stride(0), ROWS=rows, HAS_BIAS=bias is not None, BLOCK_N=tile.block_n,
                BLOCK_K=min(tile.block_k, triton.next_power_of_2(depth)), num_warps=tile.num_warps)
    return out.reshape(*x.shape[:-1], num_out)


def gemv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with the table's choice: the Triton kernel where `gemv_tile` names a tile for
    these shapes on a CUDA device (or under the interpreter), else ``F.linear`` itself."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    tile = gemv_tile(rows, weight.shape[0], weight.shape[-1], weight.dtype) if weight.dim() == 2 else None
    runnable = x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if tile is None or not runnable or x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        return F.linear(x, weight, bias)
    return gemv(x, weight, bias, tile)

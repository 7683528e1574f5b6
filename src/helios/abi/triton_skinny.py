"""A Triton matrix product for the projections of a decode step of one row or a few dozen (CUDA; CPU
under TRITON_INTERPRET=1), used where a committed table says it beats cuBLAS. (At one row a 16-row
tile masks the other fifteen: the dot's work is free where the weight reads bound the step, and the
kernel's dependent launch and L2 prefetch hide the ramp that cuBLAS's GEMV pays per projection.)

At 64 rows a decode step's projections still read far more weight bytes than they compute with:
``y = x @ W.T``, x [M, K] with M <= 64 or so, is memory-bound, and what it costs is how fast the
kernel streams W. cuBLAS's kernels at those shapes read the 8B decoder's weights at 2.8-3.8 TB/s of
the H200's 4.2 (bench/results/h200_session25_call1/served_timeline.txt: the output projection 12 us
for 33.5 MB, the fused qkv 16.5 us for 50 MB). This kernel gives each program a [BLOCK_M, BLOCK_N]
output tile and streams its [BLOCK_N, K] slice of W through ``tl.dot`` in BLOCK_K steps (software
pipelined, `num_stages` loads in flight), float32 sums, one rounding to the output dtype.

Where N / BLOCK_N programs are too few to keep every SM reading, the reduction splits SPLIT_K ways:
each (tile, split) program stores its float32 partial sums, counts itself in on the tile's counter
(an acquire-release atomic), and the program that arrives last adds the partials in split order and
writes the output, then resets the counter for the next call. The sum order is fixed, so the result
does not depend on which program arrives last: the same inputs give the same bits on every call.
The counters are one int32 per output tile, zero between calls, kept per device (`_counters`,
allocated outside any graph capture: the graphs' warm-up runs come first).

`skinny_linear` computes ``F.linear`` for any input: rows past the tile, another device, dtype,
layout or shape go to ``F.linear`` itself, so a graph bound to it stays exact for every call.

`skinny_silu_linear` is ``helios::silu_mul(F.linear(x, W))`` for the MLP's fused gate/up weight
(W [2F, K]: the gate's F rows, then the up's) in one launch: each program computes the same W rows
the gate/up tile's program would (block_n of them: block_n / 2 gate rows and the up rows F further
on), rounds both products to the output dtype as the projection's output is rounded, and applies
the SiLU-mul in its epilogue with ``silu_mul``'s own arithmetic (`helios.abi.triton_fused`), so the
[M, 2F] product is never written or read back and the SiLU-mul's launch goes. Capture binds it where
a tabled gate/up projection's only reader is the SiLU-mul (`helios.runtime.loading.gemv_calls`).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from helios.abi import dependent_launch as pdl_launch
from helios.abi.gemv_tiles import SkinnyTile, skinny_tile
from helios.abi.triton_paged import on_device

__all__ = ["skinny", "skinny_fits", "skinny_linear", "skinny_silu", "skinny_silu_linear"]

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # counters replaced by larger ones: graphs captured before may read them


@triton.jit
def _prefetch_rows(w_ptr, rows, stride_wn, PREFETCH: tl.constexpr):
    """Asks L2 for the first PREFETCH columns of W's `rows`, one request per 128-byte line, before
    the previous kernel has finished (the weights are never written by it)."""
    if PREFETCH > 0:
        LINE: tl.constexpr = 128 // w_ptr.dtype.element_ty.primitive_bitwidth * 8
        lines = tl.arange(0, PREFETCH // LINE) * LINE
        at = w_ptr + rows[:, None].to(tl.int64) * stride_wn + lines[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [at], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _await_previous():
    """Under programmatic dependent launch: let the next kernel start, then wait until the previous
    kernel's writes are visible (before this program reads x or writes anything)."""
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr, rows, span,
                   stride_xm, stride_wn, stride_om, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                   PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0):
    """out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over this program's output tile; with
    SPLIT_K > 1 this program sums one K / SPLIT_K slice and the last of the tile's programs adds them."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = ms < rows
    ks = split * span + tl.arange(0, BLOCK_K)  # span: depth / SPLIT_K, a multiple of BLOCK_K
    x_at = x_ptr + ms[:, None].to(tl.int64) * stride_xm + ks[None, :]
    w_at = w_ptr + ns[None, :].to(tl.int64) * stride_wn + ks[:, None]  # [BLOCK_K, BLOCK_N] of W^T
    if PDL:
        _prefetch_rows(w_ptr + split * span, ns, stride_wn, PREFETCH)
        _await_previous()
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, span, BLOCK_K):
        a = tl.load(x_at, mask=m_ok[:, None], other=0.0)
        b = tl.load(w_at)  # the host checks that BLOCK_N divides num_out
        acc = tl.dot(a, b, acc)
        x_at += BLOCK_K
        w_at += BLOCK_K
    out_at = out_ptr + ms[:, None].to(tl.int64) * stride_om + ns[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + ns).to(tl.float32)[None, :]
        tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        tile_size = BLOCK_M * BLOCK_N
        offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        partials = partial_ptr + tile.to(tl.int64) * SPLIT_K * tile_size
        tl.store(partials + split * tile_size + offsets, acc)
        tl.debug_barrier()  # every thread's partials stored before the (one-thread) release below
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last: every other split's partials are visible now
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for part in tl.static_range(SPLIT_K):
                total += tl.load(partials + part * tile_size + offsets, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(bias_ptr + ns).to(tl.float32)[None, :]
            tl.store(out_at, total.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])
            tl.atomic_xchg(counter_ptr + tile, 0)


@triton.jit
def _skinny_silu_kernel(x_ptr, w_ptr, out_ptr, rows, width, depth, stride_xm, stride_wn, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
                        PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0):
    """out[m, f] = silu_mul of (x @ W^T)[m, f] and [m, width + f] over this program's BLOCK_F
    features f (W rows f and width + f), each product rounded to the output dtype first."""
    pid_f = tl.program_id(0)
    pid_m = tl.program_id(1)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    fs = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    m_ok = ms < rows
    ks = tl.arange(0, BLOCK_K)
    x_at = x_ptr + ms[:, None].to(tl.int64) * stride_xm + ks[None, :]
    gate_at = w_ptr + fs[None, :].to(tl.int64) * stride_wn + ks[:, None]
    up_at = gate_at + width.to(tl.int64) * stride_wn
    if PDL:
        _prefetch_rows(w_ptr, fs, stride_wn, PREFETCH)
        _prefetch_rows(w_ptr + width.to(tl.int64) * stride_wn, fs, stride_wn, PREFETCH)
        _await_previous()
    gate = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
    for _ in range(0, depth, BLOCK_K):  # the host checks that BLOCK_K divides depth
        a = tl.load(x_at, mask=m_ok[:, None], other=0.0)
        gate = tl.dot(a, tl.load(gate_at), gate)
        up = tl.dot(a, tl.load(up_at), up)
        x_at += BLOCK_K
        gate_at += BLOCK_K
        up_at += BLOCK_K
    kind = out_ptr.dtype.element_ty
    gate = gate.to(kind).to(tl.float32)  # the projection's output, as `silu_mul` reads it
    up = up.to(kind).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(kind)  # silu, rounded like torch's
    tl.store(out_ptr + ms[:, None].to(tl.int64) * stride_om + fs[None, :],
             (activated.to(tl.float32) * up).to(kind), mask=m_ok[:, None])


def skinny_fits(rows: int, num_out: int, depth: int, tile: SkinnyTile) -> bool:
    """Whether the kernel takes these shapes with `tile`: whole BLOCK_N column blocks and whole
    BLOCK_K steps in every split."""
    return rows >= 1 and num_out % tile.block_n == 0 and depth % (tile.block_k * tile.split_k) == 0


def skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: SkinnyTile, *,
           pdl: bool | None = None, prefetch: int | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by the Triton kernel, for x [..., K] and a contiguous-row weight
    [N, K] whose shapes `skinny_fits` the tile (ValueError otherwise). `pdl` (default: where
    `dependent_launch` says) launches it with programmatic dependent launch, its programs first
    asking L2 for `prefetch` columns of their weight rows (default `PREFETCH_COLUMNS`)."""
    depth, num_out = x.shape[-1], weight.shape[0]
    flat, weight = _operands("skinny", x, weight, bias)
    rows = flat.shape[0]
    if not skinny_fits(rows, num_out, depth, tile):
        raise ValueError(f"skinny: {rows} x {depth} @ {num_out} x {depth} does not fit tile {tile.label}")
    out = torch.empty((rows, num_out), dtype=x.dtype, device=x.device)
    pdl, prefetch = _dependent(flat, pdl, prefetch)
    grid = (num_out // tile.block_n, triton.cdiv(rows, tile.block_m), tile.split_k)
    tiles = grid[0] * grid[1]
    if tile.split_k > 1:
        partials = torch.empty((tiles, tile.split_k, tile.block_m * tile.block_n), dtype=torch.float32,
                               device=x.device)
        counters = _counters(x.device, tiles)
    else:
        partials = counters = out
    with on_device(x):
        _skinny_kernel[grid](
            flat, weight, weight if bias is None else bias, out, partials, counters, rows, depth // tile.split_k,
            flat.stride(0), weight.stride(0), out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=tile.block_m,
            BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT_K=tile.split_k, PDL=pdl, PREFETCH=prefetch,
            num_warps=tile.num_warps, num_stages=tile.num_stages, launch_pdl=pdl)
    return out.reshape(*x.shape[:-1], num_out)


def _dependent(x: torch.Tensor, pdl: bool | None, prefetch: int | None) -> tuple[bool, int]:
    """(whether to launch with PDL, the columns to prefetch: none without it)."""
    pdl = pdl_launch.dependent_launch(x) if pdl is None else pdl
    prefetch = pdl_launch.PREFETCH_COLUMNS if prefetch is None else prefetch
    return pdl, prefetch if pdl else 0


def _operands(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """(x as [rows, K] with unit stride along K, weight with contiguous rows); ValueError unless x
    [..., K], weight [N, K] and bias [N] (or None) agree in shape, device and dtype."""
    if not _operands_agree(x, weight, bias):
        raise ValueError(f"{name}: x {tuple(x.shape)} {x.dtype} on {x.device}, weight {tuple(weight.shape)} "
                         f"{weight.dtype} on {weight.device} and bias "
                         f"{None if bias is None else (tuple(bias.shape), bias.dtype)} do not agree")
    flat = x.reshape(-1, x.shape[-1])
    return (flat if flat.stride(-1) == 1 else flat.contiguous(),
            weight if weight.stride(-1) == 1 else weight.contiguous())


def _operands_agree(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    matrix = (x.dim() >= 1 and weight.dim() == 2 and x.shape[-1] == weight.shape[1] and x.dtype == weight.dtype
              and x.device == weight.device)
    if bias is None or not matrix:
        return matrix
    return (bias.shape == (weight.shape[0],) and bias.dtype == x.dtype and bias.device == x.device
            and bias.stride(0) == 1)


def skinny_silu(x: torch.Tensor, weight: torch.Tensor, tile: SkinnyTile, *, pdl: bool | None = None,
                prefetch: int | None = None) -> torch.Tensor:
    """``silu_mul(F.linear(x, weight))`` in one launch, for x [..., K] and a contiguous-row gate/up
    weight [2F, K] whose shapes fit `tile` (the gate/up projection's tile, unsplit; ValueError
    otherwise): each program reads the tile's block_n rows of W, block_n / 2 of the gate's and as
    many of the up's. `pdl` and `prefetch` as for `skinny`."""
    depth, width = x.shape[-1], weight.shape[0] // 2
    flat, weight = _operands("skinny_silu", x, weight, None)
    rows = flat.shape[0]
    if not silu_fits(rows, weight.shape[0], depth, tile):
        raise ValueError(f"skinny_silu: {rows} x {depth} @ {weight.shape[0]} x {depth} does not fit tile {tile.label}")
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    pdl, prefetch = _dependent(flat, pdl, prefetch)
    block_f = tile.block_n // 2
    with on_device(x):
        _skinny_silu_kernel[(width // block_f, triton.cdiv(rows, tile.block_m))](
            flat, weight, out, rows, width, depth, flat.stride(0), weight.stride(0), out.stride(0),
            BLOCK_M=tile.block_m, BLOCK_F=block_f, BLOCK_K=tile.block_k, PDL=pdl, PREFETCH=prefetch,
            num_warps=tile.num_warps, num_stages=tile.num_stages, launch_pdl=pdl)
    return out.reshape(*x.shape[:-1], width)


def silu_fits(rows: int, num_out: int, depth: int, tile: SkinnyTile) -> bool:
    """Whether `skinny_silu` takes a gate/up weight of `num_out` rows with `tile`: an even row count,
    halves of whole block_n / 2 (at least 16) feature blocks, an unsplit reduction of whole steps."""
    block_f = tile.block_n // 2
    return (rows >= 1 and tile.split_k == 1 and num_out % 2 == 0 and block_f >= 16
            and (num_out // 2) % block_f == 0 and depth % tile.block_k == 0)


def skinny_silu_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``helios::silu_mul(F.linear(x, weight))``: by `skinny_silu` where `skinny_tile` names a tile
    for the projection's shapes that `silu_fits` (on a CUDA device, or under the interpreter), else
    by the two ops themselves."""
    tile = _table_tile(x, weight, None, silu_fits) if x.dim() == 2 else None
    if tile is None:
        return torch.ops.helios.silu_mul(F.linear(x, weight))
    return skinny_silu(x, weight, tile)


def _counters(device: torch.device, count: int) -> torch.Tensor:
    """At least `count` int32 tile counters on `device`, all zero between calls (each call's last
    programs reset theirs). Made, or grown, only outside a CUDA graph capture; a grown set replaces
    the device's set for later calls, and the old one is kept alive for the graphs that hold it."""
    counters = _COUNTERS.get(device)
    if counters is None or counters.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("skinny: tile counters are made by an uncaptured call first (a graph's warm-up)")
        if counters is not None:  # never freed: a graph captured with it keeps its address
            _OUTGROWN.append(counters)
        counters = torch.zeros(max(count, 1024), dtype=torch.int32, device=device)
        _COUNTERS[device] = counters
    return counters


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with the table's choice: the Triton kernel where `skinny_tile` names a tile for
    these shapes on a CUDA device (or under the interpreter), else ``F.linear`` itself."""
    tile = _table_tile(x, weight, bias, skinny_fits)
    if tile is None:
        return F.linear(x, weight, bias)  # its own errors for operands that do not agree
    return skinny(x, weight, bias, tile)


def _table_tile(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fits) -> SkinnyTile | None:
    """The table's tile for these operands where the kernel can run it (a CUDA device, or the
    interpreter), the operands agree and `fits(rows, out, in, tile)`; else None."""
    if not _operands_agree(x, weight, bias) or not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    rows = x.numel() // max(x.shape[-1], 1)
    tile = skinny_tile(rows, weight.shape[0], weight.shape[1], weight.dtype)
    return tile if tile is not None and fits(rows, weight.shape[0], weight.shape[1], tile) else None

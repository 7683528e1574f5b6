"""Is a Triton GEMV worth an ABI op? cuBLAS (`F.linear`) against a split-row Triton GEMV at the 8B
decoder's projection shapes, one to a few rows, in one CUDA graph per side (bench only: programs do
not call this kernel).

At batch 1 a decode step is its matrix-vector products: the anchor and Helios both run cuBLAS, so
beating the anchor by 15% there needs GEMVs closer to the copy bandwidth than cuBLAS gets. This
prints, per shape, both sides' ms and GB/s (weight bytes over time) and their sum over one decode
step (32 layers), so the next step can be decided on numbers.

    python bench/gemv_ab.py [--rows 1]      (bench/anchor_compare.py runs it at one row)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lever_ab import graph_ms  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # [N, K]


@triton.jit
def _gemv_kernel(x, w, out, num_out, depth, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[r, n] = sum_k x[r, k] * w[n, k] for BLOCK_N outputs of every row r < ROWS (float32 sums)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = cols < num_out
    for row in tl.static_range(ROWS):
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, depth, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            tile = tl.load(w + cols[:, None].to(tl.int64) * depth + ks[None, :], mask=inside[:, None], other=0.0)
            vector = tl.load(x + row * depth + ks)
            acc += tl.sum(tile.to(tl.float32) * vector.to(tl.float32)[None, :], axis=1)
        tl.store(out + row * num_out + cols, acc.to(out.dtype.element_ty), mask=inside)


def triton_gemv(x: torch.Tensor, w: torch.Tensor, block_n: int = 8, block_k: int = 512) -> torch.Tensor:
    """x [R, K] @ w[N, K].T for a few rows R (K a multiple of block_k)."""
    rows, depth = x.shape
    out = torch.empty((rows, w.shape[0]), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(w.shape[0], block_n),)](x, w, out, w.shape[0], depth, ROWS=rows, BLOCK_N=block_n,
                                                      BLOCK_K=block_k, num_warps=4)
    return out


def gemv_ab(rows_list, layers: int, log) -> list[dict]:
    results = []
    for rows in rows_list:
        step = {"cublas": 0.0, "triton": 0.0}
        for name, (num_out, depth) in SHAPES.items():
            w = torch.randn(num_out, depth, device="cuda", dtype=torch.bfloat16) * 0.02
            x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(triton_gemv(x, w), F.linear(x, w), rtol=2e-2, atol=2e-2)
            theirs, ours = graph_ms(lambda: F.linear(x, w), 8), graph_ms(lambda: triton_gemv(x, w), 8)
            gbs = lambda ms: 8 * w.numel() * 2 / ms / 1e6  # noqa: E731  (8 calls per graph)
            results.append({"rows": rows, "shape": name, "cublas_ms": theirs / 8, "triton_ms": ours / 8,
                            "cublas_gbs": gbs(theirs), "triton_gbs": gbs(ours)})
            step["cublas"] += layers * theirs / 8
            step["triton"] += layers * ours / 8
            log(f"GEMV R={rows} {name} {num_out}x{depth}: cuBLAS {theirs / 8:.4f} ms ({gbs(theirs):.0f} GB/s), "
                f"Triton {ours / 8:.4f} ms ({gbs(ours):.0f} GB/s)")
        log(f"GEMV R={rows}, {layers} layers: cuBLAS {step['cublas']:.3f} ms, Triton {step['triton']:.3f} ms per step")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1", help="rows (the kernel re-reads the weights per row: keep it small)")
    parser.add_argument("--layers", type=int, default=32)
    arguments = parser.parse_args()
    gemv_ab([int(r) for r in arguments.rows.split(",")], arguments.layers, lambda line: print(line, flush=True))

"""The 256-row down projection on a Triton TMA kernel with its split-K reduction inside it, against
cuBLAS (CUDA, Hopper or later).

At 256 rows cuBLAS runs the down projection (x [256, 14336] @ W [4096, 14336]^T) on 128x128 split-K
tiles and a separate reduction kernel: 1.33 ms and 0.14 ms of a served step's 7.5 ms of kernels
(bench/results/h200_session41_call7). Here each (tile, split) program of the kernel sums one K /
SPLIT_K slice through TMA loads, stores its float32 partials, counts itself in on the tile's
counter, and the last to arrive adds the partials in split order (the same bits on every call,
whichever arrives last) and writes the output, as `helios.abi.triton_skinny` does at fewer rows.

Timed like `bench/wide_silu_ab.py`: each side in a CUDA graph of `--copies` calls on distinct
weights, rested and sustained, the finalists alternated with cuBLAS over `--rounds` rounds, on
random rows (the power a step draws depends on its data: `bench/power_floor.py --alike-rows`).

    python bench/wide_down_ab.py [--rows 256] [--copies 6] [--sustain-ms 400]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wide_silu_ab import _descriptors, _tiles, alternate, parse_arguments, timer  # noqa: E402

HIDDEN, FFN = 4096, 14336  # the down projection's weight: [HIDDEN, FFN]


@triton.jit
def _split_kernel(x_desc, w_desc, out_ptr, partial_ptr, counter_ptr, rows, span, stride_om, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    pid_m, pid_n = _tiles(tile, tl.cdiv(rows, BLOCK_M))
    m0, n0 = pid_m * BLOCK_M, pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(split * span, (split + 1) * span, BLOCK_K):
        acc = tl.dot(x_desc.load([m0, k]), w_desc.load([n0, k]).T, acc)
    ms, ns = m0 + tl.arange(0, BLOCK_M), n0 + tl.arange(0, BLOCK_N)
    out_at = out_ptr + ms[:, None].to(tl.int64) * stride_om + ns[None, :]
    if SPLIT_K == 1:
        tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=(ms < rows)[:, None])
    else:
        size = BLOCK_M * BLOCK_N
        offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        partials = partial_ptr + tile.to(tl.int64) * SPLIT_K * size
        tl.store(partials + split * size + offsets, acc)
        tl.debug_barrier()  # every thread's partials stored before the release below
        if tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for part in tl.static_range(SPLIT_K):
                total += tl.load(partials + part * size + offsets, cache_modifier=".cg")
            tl.store(out_at, total.to(out_ptr.dtype.element_ty), mask=(ms < rows)[:, None])
            tl.atomic_xchg(counter_ptr + tile, 0)


class SplitDown:
    """The kernel at one tile, with its partials and counters made once (outside graph capture)."""

    def __init__(self, rows: int, block_m: int, block_n: int, block_k: int, split: int, warps: int, stages: int):
        self.tile = (block_m, block_n, block_k)
        self.split, self.warps, self.stages = split, warps, stages
        self.tiles = triton.cdiv(rows, block_m) * (HIDDEN // block_n)
        self.partials = torch.empty((self.tiles, split, block_m * block_n), dtype=torch.float32, device="cuda")
        self.counters = torch.zeros(self.tiles, dtype=torch.int32, device="cuda")

    @property
    def label(self) -> str:
        return f"TMA split-K {'x'.join(map(str, self.tile))}/{self.split} w{self.warps}s{self.stages}"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        block_m, block_n, block_k = self.tile
        rows, depth = x.shape
        out = torch.empty((rows, weight.shape[0]), dtype=x.dtype, device=x.device)
        x_desc, w_desc = _descriptors(x, weight, block_m, block_n, block_k)
        _split_kernel[(self.tiles, self.split)](
            x_desc, w_desc, out, self.partials, self.counters, rows, depth // self.split, out.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=self.split, num_warps=self.warps,
            num_stages=self.stages)
        return out


TILES = [  # block_m, block_n, block_k, split, warps, stages (depth / split a multiple of block_k)
    (256, 128, 64, 4, 8, 4), (256, 128, 64, 2, 8, 4), (128, 128, 64, 2, 8, 4), (128, 128, 64, 4, 8, 4),
    (128, 256, 64, 4, 8, 3), (256, 64, 64, 4, 8, 4), (128, 64, 64, 2, 4, 4), (256, 128, 64, 7, 8, 4),
]


def main() -> int:
    args = parse_arguments(__doc__.splitlines()[0])
    torch.manual_seed(0)
    weights = [torch.randn(HIDDEN, FFN, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(args.copies)]
    x = torch.randn(args.rows, FFN, device="cuda", dtype=torch.bfloat16)
    expected = F.linear(x, weights[0])
    time_both = timer(weights, 2.0 * args.rows * HIDDEN * FFN, args.sustain_ms)

    cublas = lambda w: F.linear(x, w)  # noqa: E731
    time_both("cuBLAS", cublas)
    results, calls = {}, {}
    for block_m, block_n, block_k, split, warps, stages in TILES:
        kernel = SplitDown(args.rows, block_m, block_n, block_k, split, warps, stages)
        call = lambda w, kernel=kernel: kernel(x, w)  # noqa: E731
        try:
            got = call(weights[0])
            torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
            if not torch.equal(got, call(weights[0])):
                raise AssertionError("two calls differ")
            results[kernel.label] = time_both(kernel.label, call)
            calls[kernel.label] = call
        except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported)
            print(f"{kernel.label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
    if results:
        finalists = dict(sorted(results.items(), key=lambda item: item[1][1])[:args.finalists])
        alternate(finalists, calls, time_both, cublas, args.rounds, "cuBLAS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

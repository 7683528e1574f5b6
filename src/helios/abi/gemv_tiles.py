"""The committed tables of projections that run a Triton kernel instead of cuBLAS, and the tile of
each: one-row projections on the matrix-vector kernel (`helios.abi.triton_gemv`), projections of one
row or a few dozen on the skinny matrix product (`helios.abi.triton_skinny`). No triton import: the
runtime reads the tables at capture (`helios.runtime.loading.gemv_calls`) and imports a kernel only
where a call has a tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GEMV_TILES", "GemvTile", "MAX_ROWS", "SKINNY_TILES", "SkinnyTile", "gemv_tile", "skinny_tile"]

MAX_ROWS = 1  # the table is measured at one row (the kernel re-reads the weights once per row)


@dataclass(frozen=True)
class GemvTile:
    """Output features a program computes (`block_n`), reduction slice (`block_k`) and warps."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4

    @classmethod
    def parse(cls, text: str) -> "GemvTile":
        """``block_n x block_k x num_warps``, e.g. ``8x512x4``."""
        try:
            block_n, block_k, warps = (int(field) for field in text.strip().lower().split("x"))
        except ValueError:
            raise ValueError(f"gemv tile {text!r}: want block_n x block_k x warps") from None
        return cls(block_n, block_k, warps)

    @property
    def label(self) -> str:
        return f"{self.block_n}x{self.block_k}x{self.num_warps}"


# (out features, in features) -> tile, for 16-bit weights, one row. Empty: on an H200 at Llama-3.1-8B
# shapes the kernel beats cuBLAS alone (bench/results/h200_decode_gpu_call1/gemv_ab.log, six distinct
# weights a graph: the fused qkv 6144x4096 0.0157 ms on 4x512x4 against 0.0165, the output projection
# 4096x4096 0.0125 against 0.0142; gate/up and down no), and in a decode step its calls take about
# 13 us each against cuBLAS's 15.3 (qkv) and 10.8 + 1.7 (o, split-K and its reduction), but the
# captured step with both bound replayed at 1.003x and 0.94x the all-cuBLAS step in two calls
# (bench/results/h200_decode_gpu_call{1,2}/decode_step_profile.log): no measured gain, so no entry.
GEMV_TILES: dict[tuple[int, int], GemvTile] = {}


def gemv_tile(rows: int, out_features: int, in_features: int, dtype: torch.dtype) -> GemvTile | None:
    """The tile for ``F.linear`` of `rows` rows on an [out, in] weight of `dtype`, or None (cuBLAS)."""
    if rows < 1 or rows > MAX_ROWS or dtype not in (torch.bfloat16, torch.float16):
        return None
    return GEMV_TILES.get((out_features, in_features))


@dataclass(frozen=True)
class SkinnyTile:
    """An output tile of `block_m` rows by `block_n` features, its reduction in `block_k` steps split
    `split_k` ways, and the launch's warps and pipeline stages."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    @classmethod
    def parse(cls, text: str) -> "SkinnyTile":
        """``block_m x block_n x block_k / split_k w warps s stages``, e.g. ``64x64x128/2w4s4``."""
        try:
            blocks, rest = text.strip().lower().split("/")
            split, rest = rest.split("w")
            warps, stages = rest.split("s")
            block_m, block_n, block_k = (int(field) for field in blocks.split("x"))
            tile = cls(block_m, block_n, block_k, int(split), int(warps), int(stages))
        except ValueError:
            raise ValueError(f"skinny tile {text!r}: want block_m x block_n x block_k / split w warps s stages"
                             ) from None
        if min(block_m, block_n, block_k) < 16 or min(tile.split_k, tile.num_warps, tile.num_stages) < 1:
            raise ValueError(f"skinny tile {text!r}: blocks of at least 16, split, warps and stages of at least 1")
        return tile

    @property
    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k}/{self.split_k}"
                f"w{self.num_warps}s{self.num_stages}")


# (rows bucket, out features, in features) -> tile, for 16-bit weights: the bucket is a power of two and
# serves the calls of more than half of it and at most it (64: 33-64 rows; 1: one row). Measured on an H200 at
# Llama-3.1-8B shapes by bench/skinny_ab.py (bench/results/h200_session28_call1: at 64 rows the MLP's
# projections 1.04x and 1.08x cuBLAS alone, the whole greedy decode step 5.613 -> 5.478 ms; the fused
# qkv and the output projection stay faster on cuBLAS, as does every projection at 256 rows). The output
# projection since session 38 (bench/results/h200_session38_call1, `skinny_ab.py --wide`: 1.07x cuBLAS
# alone, the whole greedy step 5.269 -> 5.236 ms in every round; the qkv's best, 64x32x64/1w4s8, 0.92x).
SKINNY_TILES: dict[tuple[int, int, int], SkinnyTile] = {
    (64, 28672, 4096): SkinnyTile(64, 128, 128, 1, 8, 4),  # gate/up
    (64, 4096, 14336): SkinnyTile(64, 32, 128, 1, 4, 6),  # down
    (64, 4096, 4096): SkinnyTile(64, 32, 128, 1, 4, 6),  # output projection
    # One row (session 38, bench/results/h200_session38_call3, `skinny_ab.py --rows 1 --wide`): alone the
    # kernel is 1.00x / 1.15x / 0.99x / 1.04x cuBLAS at qkv / output / gate-up / down, but in a step it
    # starts under dependent launch with its weight rows asked into L2 before the previous kernel ends, and
    # the SiLU-mul rides in the gate/up epilogue: the whole greedy one-row step 4.659 -> 4.494 ms (1.037x,
    # every round), the decode 226.2 tok/s against 213-217 with cuBLAS.
    (1, 6144, 4096): SkinnyTile(16, 32, 128, 1, 2, 6),  # qkv
    (1, 4096, 4096): SkinnyTile(16, 16, 256, 1, 2, 6),  # output projection
    (1, 28672, 4096): SkinnyTile(16, 128, 128, 1, 8, 5),  # gate/up
    (1, 4096, 14336): SkinnyTile(16, 64, 256, 2, 4, 5),  # down
    # Four and sixteen rows, the decode buckets `helios prepare` captures by default (session 39,
    # bench/results/h200_session39_call1, `skinny_ab.py --rows 4,16 --wide`: alone 1.02x / 1.13x / 0.99x /
    # 1.02x cuBLAS at 4 rows and 1.03x / 1.16x / 0.98x / 1.05x at 16 for qkv / output / gate-up / down; the
    # whole greedy step with them and the SiLU-mul fused 5.078 -> 4.781 ms at 16 rows (1.062x), every round).
    # At 4 rows the gate/up tile that fuses the SiLU-mul (session 40, bench/results/h200_session40_call1):
    # the step 4.826 -> 4.685 ms (1.030x; 1.021x with session 39's 16x16x128, which could not fuse it).
    (4, 6144, 4096): SkinnyTile(16, 32, 128, 1, 2, 6),  # qkv
    (4, 4096, 4096): SkinnyTile(16, 32, 256, 1, 4, 6),  # output projection
    (4, 28672, 4096): SkinnyTile(16, 128, 128, 1, 8, 5),  # gate/up (tied 16x16x128 alone; this one fuses the SiLU-mul)
    (4, 4096, 14336): SkinnyTile(16, 64, 256, 2, 4, 5),  # down
    (16, 6144, 4096): SkinnyTile(16, 32, 128, 1, 2, 6),  # qkv
    (16, 4096, 4096): SkinnyTile(16, 32, 256, 1, 2, 6),  # output projection
    (16, 28672, 4096): SkinnyTile(16, 128, 128, 1, 8, 5),  # gate/up
    (16, 4096, 14336): SkinnyTile(16, 32, 256, 1, 2, 6),  # down
}


def skinny_tile(rows: int, out_features: int, in_features: int, dtype: torch.dtype) -> SkinnyTile | None:
    """The tile for ``F.linear`` of `rows` rows on an [out, in] weight of `dtype`: the entry of the
    rows' bucket (the next power of two; one row is a bucket of its own, where a `GEMV_TILES` entry,
    bound first, wins), or None (cuBLAS)."""
    if rows < 1 or dtype not in (torch.bfloat16, torch.float16):
        return None
    return SKINNY_TILES.get((1 << (rows - 1).bit_length(), out_features, in_features))

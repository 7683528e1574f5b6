"""The committed table of one-row projections that run the Triton matrix-vector kernel
(`helios.abi.triton_gemv`) instead of cuBLAS, and the tile of each. No triton import: the runtime
reads the table at capture (`helios.runtime.loading.gemv_calls`) and imports the kernel only where a
call has a tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GEMV_TILES", "GemvTile", "MAX_ROWS", "gemv_tile"]

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


# (out features, in features) -> tile, for 16-bit weights, one row. H200, Llama-3.1-8B shapes, six
# distinct weights per graph (bench/results/h200_decode_gpu_call1/gemv_ab.log): the fused qkv 6144x4096
# 0.0157 ms on 4x512x4 against cuBLAS 0.0165, the output projection 4096x4096 0.0125 against 0.0142; the
# fused gate/up (0.0573 vs 0.0578, within noise) and down (0.0341 vs 0.0328) projections stay on cuBLAS.
GEMV_TILES: dict[tuple[int, int], GemvTile] = {(6144, 4096): GemvTile(4, 512, 4), (4096, 4096): GemvTile(4, 512, 4)}


def gemv_tile(rows: int, out_features: int, in_features: int, dtype: torch.dtype) -> GemvTile | None:
    """The tile for ``F.linear`` of `rows` rows on an [out, in] weight of `dtype`, or None (cuBLAS)."""
    if rows < 1 or rows > MAX_ROWS or dtype not in (torch.bfloat16, torch.float16):
        return None
    return GEMV_TILES.get((out_features, in_features))

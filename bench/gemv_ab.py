"""Triton GEMV (`helios.abi.triton_gemv`, what capture binds one-row projections to where
`helios.abi.gemv_tiles.GEMV_TILES` names a tile) against cuBLAS (`F.linear`) at the 8B decoder's
projection shapes, one row, each side in one CUDA graph per shape.

At batch 1 a decode step is its matrix-vector products. Each graph calls the shape `--copies`
times on that many distinct weights (as a decode step reads each layer's weights once: no L2 reuse
between calls). Prints, per shape, cuBLAS and every swept tile (ms, GB/s of weight bytes), the best
tile, their sums over one decode step (32 layers), and the table entries to adopt (the shapes where
the best tile beats cuBLAS by more than 2%).

    python bench/gemv_ab.py [--rows 1] [--tiles 8x512x4,16x512x4] [--copies 6]
    (bench/anchor_compare.py runs it with the table's tiles at one row)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lever_ab import graph_ms  # noqa: E402

from helios.abi.gemv_tiles import GEMV_TILES, GemvTile  # noqa: E402
from helios.abi.triton_gemv import gemv  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # [N, K]
DEVICE = "cuda"  # (a CPU check of the script sets "cpu" under the Triton interpreter)
TILES = "8x512x4,4x512x4,16x512x4,8x1024x4,16x256x4,8x512x8,32x256x8,16x1024x8"


def triton_gemv(x: torch.Tensor, w: torch.Tensor, tile: GemvTile | None = None) -> torch.Tensor:
    return gemv(x, w, tile=tile)


def gemv_ab(rows_list, layers: int, log, tiles: list[GemvTile] | None = None, copies: int = 6) -> list[dict]:
    """Per row count and shape: cuBLAS and each tile (default: the table's tiles and the default)."""
    tiles = tiles or sorted(set(GEMV_TILES.values()) | {GemvTile()}, key=lambda t: t.label)
    results = []
    for rows in rows_list:
        step = {"cublas": 0.0, "best": 0.0}
        for name, (num_out, depth) in SHAPES.items():
            row = _shape_row(rows, name, num_out, depth, tiles, copies, log)
            results.append(row)
            step["cublas"] += layers * row["cublas_ms"]
            step["best"] += layers * min(row["cublas_ms"], row["best_ms"])
            if row["best_ms"] < 0.98 * row["cublas_ms"]:
                log(f"adopt GEMV_TILES[({num_out}, {depth})] = GemvTile.parse({row['best_tile']!r})  # {name}, "
                    f"{row['cublas_ms'] / row['best_ms']:.2f}x cuBLAS at {rows} row(s)")
        log(f"GEMV R={rows}, {layers} layers: cuBLAS {step['cublas']:.3f} ms, best of each {step['best']:.3f} ms "
            "per step")
    return results


def _shape_row(rows: int, name: str, num_out: int, depth: int, tiles, copies: int, log) -> dict:
    weights = [torch.randn(num_out, depth, device=DEVICE, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, depth, device=DEVICE, dtype=torch.bfloat16)
    gbs = lambda ms: copies * weights[0].numel() * 2 / ms / 1e6  # noqa: E731
    theirs = graph_ms(lambda: [F.linear(x, w) for w in weights]) / copies
    row = {"rows": rows, "shape": name, "cublas_ms": theirs, "cublas_gbs": gbs(theirs * copies), "tiles": {}}
    for tile in tiles:
        try:
            torch.testing.assert_close(gemv(x, weights[0], tile=tile), F.linear(x, weights[0]), rtol=2e-2, atol=2e-2)
            ours = graph_ms(lambda tile=tile: [gemv(x, w, tile=tile) for w in weights]) / copies
        except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported, not fatal)
            log(f"GEMV R={rows} {name} tile {tile.label}: {type(error).__name__}: {str(error)[:100]}")
            continue
        row["tiles"][tile.label] = ours
    best, swept = fastest(row["tiles"])
    row.update(best_tile=best[0], best_ms=best[1], triton_ms=best[1], triton_gbs=gbs(best[1] * copies))
    log(f"GEMV R={rows} {name} {num_out}x{depth}: cuBLAS {theirs:.4f} ms ({gbs(theirs * copies):.0f} GB/s), "
        f"best Triton {best[0]} {best[1]:.4f} ms ({row['triton_gbs']:.0f} GB/s); tiles: {swept}")
    del weights
    return row


def fastest(tiles: dict[str, float], listed: int | None = None) -> tuple[tuple[str, float], str]:
    """((label, ms) of the fastest tile, or ("-", inf)), and the first `listed` tiles, fastest first."""
    ranked = sorted(tiles.items(), key=lambda item: item[1])
    swept = ", ".join(f"{label} {ms:.4f}" for label, ms in ranked[:listed])
    return (ranked[0] if ranked else ("-", float("inf"))), swept


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1", help="rows (the kernel re-reads the weights per row: keep it small)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tiles", default=TILES, help="block_n x block_k x warps, comma-separated")
    parser.add_argument("--copies", type=int, default=6, help="distinct weights per graph (no L2 reuse)")
    arguments = parser.parse_args()
    gemv_ab([int(r) for r in arguments.rows.split(",")], arguments.layers, lambda line: print(line, flush=True),
            [GemvTile.parse(t) for t in arguments.tiles.split(",")], arguments.copies)

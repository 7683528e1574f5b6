"""The Triton skinny matrix product (`helios.abi.triton_skinny`, what capture binds a projection of a
few dozen rows to where `helios.abi.gemv_tiles.SKINNY_TILES` names a tile) against cuBLAS
(`F.linear`) at the 8B decoder's projection shapes, each side in one CUDA graph per shape.

Each graph calls the shape `--copies` times on that many distinct weights (as a decode step reads
each layer's weights once: no L2 reuse between calls). Prints, per row count and shape, cuBLAS and
every swept tile (ms, GB/s of weight bytes), the best tile, the sums over one decode step (32
layers), and the table entries to adopt (the shapes where the best tile beats cuBLAS by more than
3%); `--json` writes those entries for `bench/anchor_compare.py --skinny-table`, which serves with
them and measures the whole decode step both ways.

    python bench/skinny_ab.py [--rows 64,256] [--copies 6] [--json table.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_ab import fastest  # noqa: E402
from lever_ab import graph_ms  # noqa: E402

from helios.abi.gemv_tiles import SkinnyTile  # noqa: E402
from helios.abi.triton_skinny import silu_fits, skinny, skinny_fits  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # [N, K]
SMEM_BYTES = 200 * 1024  # shared memory a tile's pipeline may take (the H200 has 227 KB a block)
ADOPT_BELOW = 0.97  # adopt a tile that takes at most this share of cuBLAS's time


def candidates(rows: int, num_out: int, depth: int, wide: bool = False) -> list[SkinnyTile]:
    """Tiles worth timing at these shapes: memory-bound rows (at most 64) stream W with deep
    pipelines and enough programs to fill the device; more rows take the compute tiles. `wide` adds
    narrower column blocks (16), shorter steps (64), two warps and up to 2,048 programs (waves that
    quantize better on 132 SMs, e.g. the fused qkv's 6,144 columns)."""
    tiles = []
    if rows <= 64:
        block_m = max(16, 1 << (rows - 1).bit_length())
        for block_n in (16, 32, 64, 128) if wide else (32, 64, 128):
            for block_k in (64, 128, 256) if wide else (128, 256):
                for split in (1, 2, 4, 8):
                    programs = num_out // block_n * split
                    if not 128 <= programs <= (2048 if wide else 1024):
                        continue
                    stage_bytes = 2 * block_k * (block_m + block_n)
                    stages = min(8 if block_k == 64 else 6, SMEM_BYTES // stage_bytes)  # the deepest that fits
                    warps = (2, 4) if wide and block_n <= 32 else (8 if block_n == 128 else 4,)
                    tiles += [SkinnyTile(block_m, block_n, block_k, split, w, stages) for w in warps]
    else:
        for block_m, block_n, block_k, warps, stages in ((128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
                                                         (64, 128, 64, 4, 4), (64, 256, 64, 8, 4),
                                                         (128, 128, 128, 8, 3)):
            for split in (1, 2):
                tiles.append(SkinnyTile(block_m, block_n, block_k, split, warps, stages))
    return [tile for tile in tiles if skinny_fits(rows, num_out, depth, tile)]


def skinny_ab(rows_list, layers: int, log, copies: int = 6, shapes=tuple(SHAPES), wide: bool = False,
              adopt_below: float = ADOPT_BELOW) -> tuple[list[dict], list[dict]]:
    """Per row count and shape: cuBLAS and each candidate tile. Returns (rows, adopted entries): the
    shapes whose best tile takes at most `adopt_below` of cuBLAS's time."""
    results, adopted = [], []
    for rows in rows_list:
        step = {"cublas": 0.0, "best": 0.0}
        for name in shapes:
            num_out, depth = SHAPES[name]
            row = _shape_row(rows, name, num_out, depth, copies, log, wide)
            results.append(row)
            step["cublas"] += layers * row["cublas_ms"]
            step["best"] += layers * min(row["cublas_ms"], row["best_ms"])
            if row["best_ms"] < adopt_below * row["cublas_ms"]:
                bucket = 1 << (rows - 1).bit_length()  # the table's key: the rows' power-of-two bucket
                adopted.append({"rows": bucket, "out": num_out, "in": depth, "tile": row["best_tile"],
                                "speedup": row["cublas_ms"] / row["best_ms"], "shape": name})
                log(f"adopt SKINNY_TILES[({bucket}, {num_out}, {depth})] = SkinnyTile.parse({row['best_tile']!r})  "
                    f"# {name}, {row['cublas_ms'] / row['best_ms']:.2f}x cuBLAS at {rows} rows")
        log(f"SKINNY R={rows}, {layers} layers: cuBLAS {step['cublas']:.3f} ms, best of each {step['best']:.3f} ms "
            "per step")
    return results, adopted


def _shape_row(rows: int, name: str, num_out: int, depth: int, copies: int, log, wide: bool = False) -> dict:
    weights = [torch.randn(num_out, depth, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    gbs = lambda ms: weights[0].numel() * 2 / ms / 1e6  # noqa: E731  (per call)
    theirs = graph_ms(lambda: [F.linear(x, w) for w in weights]) / copies
    row = {"rows": rows, "shape": name, "cublas_ms": theirs, "tiles": {}}
    expected = F.linear(x.float(), weights[0].float())
    started = time.perf_counter()
    for tile in candidates(rows, num_out, depth, wide):
        try:
            first = skinny(x, weights[0], None, tile)
            torch.testing.assert_close(first.float(), expected, rtol=2e-2, atol=2e-2)
            if not torch.equal(first, skinny(x, weights[0], None, tile)):
                raise AssertionError("two calls differ")
            ours = graph_ms(lambda tile=tile: [skinny(x, w, None, tile) for w in weights]) / copies
        except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported, not fatal)
            log(f"SKINNY R={rows} {name} tile {tile.label}: {type(error).__name__}: {str(error)[:160]}")
            continue
        row["tiles"][tile.label] = ours
    best = fastest(_fusable(rows, name, num_out, depth, row["tiles"]))[0]
    swept = fastest(row["tiles"], listed=6)[1]
    row.update(best_tile=best[0], best_ms=best[1])
    log(f"SKINNY R={rows} {name} {num_out}x{depth}: cuBLAS {theirs:.4f} ms ({gbs(theirs):.0f} GB/s), best Triton "
        f"{best[0]} {best[1]:.4f} ms ({gbs(best[1]):.0f} GB/s); {len(row['tiles'])} tiles in "
        f"{time.perf_counter() - started:.0f} s, fastest: {swept}")
    del weights
    return row


def _fusable(rows: int, name: str, num_out: int, depth: int, tiles: dict[str, float]) -> dict[str, float]:
    """The tiles the best is picked from: for the gate/up projection those that also carry the SiLU-mul
    in their epilogue (`silu_fits`; capture fuses it only there, and a step without it loses more than a
    tile's edge alone gains), where any does; every tile elsewhere."""
    if name != "gate_up":
        return tiles
    fused = {label: ms for label, ms in tiles.items() if silu_fits(rows, num_out, depth, SkinnyTile.parse(label))}
    return fused or tiles


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,256", help="row counts, comma-separated")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--copies", type=int, default=6, help="distinct weights per graph (no L2 reuse)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"projections, comma-separated, of {list(SHAPES)}")
    parser.add_argument("--wide", action="store_true", help="sweep the wider tile set (`candidates`)")
    parser.add_argument("--adopt-below", type=float, default=ADOPT_BELOW,
                        help="adopt a shape's best tile where it takes at most this share of cuBLAS's time alone "
                             "(above 1: hand tiles near cuBLAS to the whole-step A/B, which decides)")
    parser.add_argument("--json", type=Path, help="write the entries to adopt here")
    arguments = parser.parse_args()
    unknown = set(arguments.shapes.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}; pick from {list(SHAPES)}")
    _, entries = skinny_ab([int(r) for r in arguments.rows.split(",")], arguments.layers,
                           lambda line: print(line, flush=True), arguments.copies, tuple(arguments.shapes.split(",")),
                           arguments.wide, arguments.adopt_below)
    if arguments.json:
        arguments.json.write_text(json.dumps(entries, indent=1))

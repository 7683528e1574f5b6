"""Tile tuning of the Triton expert kernels (`helios.abi.triton_moe`) per launch shape, on one GPU.

For every (batch, experts, hidden, intermediate, top-k) shape asked for, this script times the whole
``helios::moe_experts`` launch (schedule, gate/up kernel, down kernel, the top-k sum) replayed in a
CUDA graph (`triton.testing.do_bench_cudagraph`), first with the table's current tiles (the defaults
when the table does not list the shape), then sweeps tiles by coordinate descent: the gate/up kernel's
tiles (rows per block, column and reduction tiles, warps, stages) with the down kernel's held, then the
down kernel's with the best gate/up tiles held (the grouped path's rows per block is shared). Every
candidate's output is checked against the default tiles' output before it is timed.

The roofline of a launch is the bytes it must read or write (the distinct selected experts' gate/up
and down weights, the token hidden states, the output) at the device-to-device copy bandwidth
measured in this process. It prints, per shape, the default and best time, the speed-up, both
roofline fractions and the chosen tiles, and writes the table (merged into ``--table``'s entries) to
``--out``, which `helios.abi.moe_tiles` reads when it is ``src/helios/abi/moe_tiles.json``.

    python bench/tune_moe.py [--shapes 128x2048x768x8] [--batches 1,64,256] [--budget-s 180] \
        [--out moe_tiles.json]

``--smoke`` runs a tiny shape with two candidates per stage on the CPU (Triton's interpreter).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
if "--smoke" in sys.argv:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

import torch  # noqa: E402

from helios.abi import moe  # noqa: E402,F401  (registers the ops)
from helios.abi import triton_moe as kernels  # noqa: E402
from helios.abi.moe_tiles import (  # noqa: E402
    TABLE_PATH, KernelTiles, LaunchTiles, load_table, shape_key, table_document, tiles_for,
)


@dataclass(frozen=True)
class Shape:
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    batch: int

    @property
    def assignments(self) -> int:
        return self.batch * self.top_k

    @property
    def path(self) -> str:
        return "gemv" if self.assignments <= kernels.GEMV_ASSIGNMENTS else "grouped"


def gemv_candidates(smoke: bool) -> list[KernelTiles]:
    if smoke:
        return [KernelTiles(1, 16, 32, 4, 1), KernelTiles(1, 32, 64, 4, 2)]
    grid = itertools.product((16, 32, 64, 128), (64, 128, 256), (2, 4, 8), (1, 2, 3, 4))
    return shuffled([KernelTiles(1, n, k, w, s) for n, k, w, s in grid])


def grouped_candidates(smoke: bool, block_m: int | None) -> list[KernelTiles]:
    if smoke:
        return [KernelTiles(block_m or 16, 16, 32, 4, 1), KernelTiles(block_m or 32, 32, 32, 4, 2)]
    rows = (block_m,) if block_m else (16, 32, 64)
    grid = itertools.product(rows, (32, 64, 128, 256), (32, 64, 128), (4, 8), (2, 3, 4, 5))
    return shuffled([KernelTiles(m, n, k, w, s) for m, n, k, w, s in grid])


def shuffled(candidates: list[KernelTiles]) -> list[KernelTiles]:
    """A fixed random order, so that a sweep cut short by its time budget samples the whole space."""
    random.Random(0).shuffle(candidates)
    return candidates


def expert_weights(shape: Shape, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    """Random expert weights of `shape` (drawn on the device: a full-size layer is ~1.2 GB)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, f = shape.experts, shape.hidden, shape.intermediate
    make = lambda *size: (torch.randn(*size, generator=gen, device=device) * 0.02).to(dtype)  # noqa: E731
    return dict(gate_up=make(e, 2 * f, h), down=make(e, h, f))


def inputs(shape: Shape, weights: dict, seed: int = 0) -> dict:
    """The op's arguments for `shape.batch` tokens routed uniformly at random to top-k experts."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype, device = weights["gate_up"].dtype, weights["gate_up"].device
    scores = torch.rand(shape.batch, shape.experts, generator=gen)
    route, ids = scores.topk(shape.top_k, dim=-1)
    hidden = torch.randn(shape.batch, shape.hidden, generator=gen).to(dtype).to(device)
    return dict(hidden=hidden, weights=route.to(device), ids=ids.to(device), gate_up=weights["gate_up"],
                gate_up_bias=None, down=weights["down"], down_bias=None, activation="silu", alpha=1.0, limit=0.0)


def roofline_bytes(shape: Shape, values: dict) -> int:
    element = values["gate_up"].element_size()
    distinct = int(values["ids"].unique().numel())
    weights = distinct * 3 * shape.hidden * shape.intermediate * element
    return weights + 2 * shape.batch * shape.hidden * element


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read plus write), median of 20 after 5 warm-ups."""
    source = torch.randn(1 << 28, device="cuda")
    target = torch.empty_like(source)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * (1 << 30) / sorted(times[5:])[10]


class Timer:
    """Seconds per launch of one tile choice; NaN for tiles that fail to compile or differ."""

    def __init__(self, values: dict, reference: torch.Tensor, smoke: bool):
        self.values, self.reference, self.smoke = values, reference, smoke

    def __call__(self, tiles: LaunchTiles) -> float:
        call = lambda: kernels.triton_moe_experts(**self.values, tiles=tiles)  # noqa: E731
        try:
            out = call()
        except Exception as error:  # a tile the compiler refuses (shared memory, registers)
            print(f"    skip {tiles}: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
            return float("nan")
        if not torch.allclose(out.float(), self.reference.float(), rtol=2e-2, atol=2e-2):
            print(f"    skip {tiles}: output differs from the default tiles'")
            return float("nan")
        if self.smoke:
            start = time.perf_counter()
            call()
            return time.perf_counter() - start
        import triton.testing

        return triton.testing.do_bench_cudagraph(call, rep=20) / 1e3


def sweep(timer: Timer, base: LaunchTiles, stage: str, candidates: list[KernelTiles], deadline: float):
    """Best (seconds, tiles) varying one kernel's tiles (`stage`) until `deadline`."""
    best = (timer(base), base)
    for tiles in candidates:
        if time.monotonic() > deadline:
            print(f"    {stage}: time budget reached")
            break
        trial = replace(base, **{stage: tiles})
        if stage == "gate_up" and base.down.block_m != tiles.block_m:
            trial = replace(trial, down=replace(base.down, block_m=tiles.block_m))
        seconds = timer(trial)
        if seconds == seconds and (best[0] != best[0] or seconds < best[0]):
            best = (seconds, trial)
    return best


def tune(shape: Shape, weights: dict, budget: float, bandwidth: float, smoke: bool):
    dtype = weights["gate_up"].dtype
    values = inputs(shape, weights)
    current = tiles_for(shape.path, shape.assignments, shape.experts, shape.hidden, shape.intermediate, dtype)
    reference = kernels.triton_moe_experts(**values, tiles=current)
    timer = Timer(values, reference, smoke)
    deadline = time.monotonic() + budget
    before = timer(current)
    grouped = shape.path == "grouped"
    first = grouped_candidates(smoke, None) if grouped else gemv_candidates(smoke)
    _, best = sweep(timer, current, "gate_up", first, time.monotonic() + budget / 2)
    second = grouped_candidates(smoke, best.gate_up.block_m) if grouped else gemv_candidates(smoke)
    seconds, best = sweep(timer, best, "down", second, deadline)
    ideal = roofline_bytes(shape, values) / bandwidth
    return before, seconds, ideal, best


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    return [tuple(int(x) for x in part.split("x")) for part in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="128x2048x768x8", help="EXPERTSxHIDDENxINTERMEDIATExTOPK, comma-separated")
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--budget-s", type=float, default=180.0, help="sweep time over all shapes")
    parser.add_argument("--table", type=Path, default=TABLE_PATH, help="table whose entries the output keeps")
    parser.add_argument("--out", type=Path, default=None, help="where to write the merged table (JSON)")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU interpreter")
    args = parser.parse_args(argv)
    smoke = args.smoke
    if smoke:
        args.shapes, args.batches, args.dtype = "4x32x16x2", "2,20", "float32"
    elif not torch.cuda.is_available():
        raise SystemExit("tune_moe.py needs a CUDA device (or --smoke)")
    dtype, device = getattr(torch, args.dtype), "cpu" if smoke else "cuda"
    shapes = [Shape(e, h, f, k, b) for e, h, f, k in parse_shapes(args.shapes)
              for b in (int(x) for x in args.batches.split(","))]
    bandwidth = float("nan") if smoke else copy_bandwidth()
    print(f"device copy bandwidth {bandwidth / 1e9:.0f} GB/s; {len(shapes)} shapes, {args.budget_s:.0f} s budget")
    table = load_table(args.table)
    rows, weights = [], {}
    for shape in shapes:
        print(f"shape E{shape.experts} H{shape.hidden} F{shape.intermediate} k{shape.top_k} batch {shape.batch} "
              f"({shape.path})", flush=True)
        layer = (shape.experts, shape.hidden, shape.intermediate)
        if layer not in weights:
            weights.clear()  # one layer's experts on the device at a time
            weights[layer] = expert_weights(shape, dtype, device)
        before, after, ideal, best = tune(shape, weights[layer], args.budget_s / len(shapes), bandwidth, smoke)
        key = shape_key(shape.path, shape.assignments, shape.experts, shape.hidden, shape.intermediate, dtype)
        table[key] = best
        rows.append((shape, before, after, ideal, best))
    print_table(rows)
    document = json.dumps(table_document(table), indent=1) + "\n"
    if args.out is not None:
        args.out.write_text(document)
        print(f"wrote {args.out}")
    else:
        print(document)


def print_table(rows) -> None:
    print(f"\n{'batch':>5} {'path':>7} {'default us':>10} {'tuned us':>9} {'speed-up':>8} "
          f"{'roofline default':>16} {'roofline tuned':>14}  tiles (gate_up | down: m n k warps stages)")
    for shape, before, after, ideal, best in rows:
        fmt = lambda t: f"{t.block_m} {t.block_n} {t.block_k} {t.num_warps} {t.num_stages}"  # noqa: E731
        print(f"{shape.batch:>5} {shape.path:>7} {before * 1e6:>10.1f} {after * 1e6:>9.1f} {before / after:>7.2f}x "
              f"{ideal / before:>16.0%} {ideal / after:>14.0%}  {fmt(best.gate_up)} | {fmt(best.down)}")


if __name__ == "__main__":
    main()

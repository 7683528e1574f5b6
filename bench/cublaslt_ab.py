"""cuBLAS's pick (``F.linear``) against every cuBLASLt heuristic candidate, per decode projection shape.

For each row count and each Llama-3.1-8B projection (fused qkv, output, fused gate/up, down, LM head),
the product of `--copies` distinct weights (no L2 reuse between calls) is captured in one CUDA graph
per algorithm: ``F.linear`` as programs run it now, and each of cuBLASLt's first `--candidates`
heuristic algorithms under each workspace limit (`helios.abi.cublaslt`), and where the committed
skinny table names a tile for the shape, that Triton kernel. Rounds alternate the graphs; reported per call: the
median us, weight bytes per us (TB/s) and TFLOP/s, the best candidate's ratio against ``F.linear`` and
whether its output equals ``F.linear``'s bit for bit (and its largest difference otherwise), then per
row count the 32-layer step's projections summed both ways.

With `--sustain-ms N` each graph is instead replayed back to back for about N ms a round and timed
over the second half (the clock a long decode run holds the device at, rather than a short
timing's), and the SM clock and power of each side's runs are printed beside it (`gpu_clocks`).

    python bench/cublaslt_ab.py [--rows 1,64,256] [--candidates 24] [--rounds 5] [--replays 10] [--sustain-ms 800]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_clocks import ClockLog  # noqa: E402

from helios.abi.cublaslt import LtProduct, available  # noqa: E402
from helios.abi.gemv_tiles import skinny_tile  # noqa: E402
from helios.abi.triton_skinny import skinny_linear  # noqa: E402
from helios.runtime.loading.gemm_algos import sustained_replay_us  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
PER_STEP = {"qkv": 32, "o": 32, "gate_up": 32, "down": 32, "lm_head": 1}


def graph_of(run, copies: list[torch.Tensor]):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for weight in copies:
            run(weight)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for weight in copies:
            run(weight)
    return graph


def timed_us(graph, replays: int, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def sustained_us(graph, sustain_ms: float, calls: int) -> float:
    """us a call over the second half of back-to-back replays lasting about `sustain_ms`."""
    each_ms = timed_us(graph, 2, calls) * calls / 1e3
    return sustained_replay_us(graph, max(4, round(sustain_ms / max(each_ms, 1e-3)))) / calls


def measure(rows: int, name: str, args, clocks: ClockLog) -> dict:
    out_features, in_features = SHAPES[name]
    weight_bytes = out_features * in_features * 2
    copies_count = max(2, min(args.copies, -(-(3 << 30) // weight_bytes)))
    generator = torch.Generator(device="cuda").manual_seed(rows * 7 + len(name))
    copies = [(torch.randn(out_features, in_features, device="cuda", generator=generator) / in_features ** 0.5
               ).to(torch.bfloat16) for _ in range(copies_count)]
    x = torch.randn(rows, in_features, device="cuda", generator=generator).to(torch.bfloat16)
    reference = F.linear(x, copies[0])
    product = LtProduct(rows, out_features, in_features, torch.bfloat16)
    graphs = {"F.linear": graph_of(lambda w: F.linear(x, w), copies)}
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        graphs["F.linear on cuBLASLt"] = graph_of(lambda w: F.linear(x, w), copies)
        lt_default = F.linear(x, copies[0])
    finally:
        torch.backends.cuda.preferred_blas_library(previous)
    notes = {"F.linear on cuBLASLt": "same bits" if torch.equal(lt_default, reference) else "differs"}
    tile = skinny_tile(rows, out_features, in_features, torch.bfloat16)
    if tile is not None:  # the Triton kernel capture binds for this shape now
        label = f"skinny {tile.label}"
        skinny_out = skinny_linear(x, copies[0])
        notes[label] = "same bits" if torch.equal(skinny_out, reference) else \
            f"max diff {(skinny_out.float() - reference.float()).abs().max().item():.3g}"
        graphs[label] = graph_of(lambda w: skinny_linear(x, w), copies)
    for algo in product.candidates(args.candidates):
        try:
            first = product.run(x, copies[0], algo)
            again = product.run(x, copies[0], algo)
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - a candidate that cannot run is reported and skipped
            notes[algo.label] = f"failed: {error}"
            continue
        if not torch.equal(first, again):
            notes[algo.label] = "not repeatable"
            continue
        difference = (first.float() - reference.float()).abs().max().item()
        notes[algo.label] = "same bits" if torch.equal(first, reference) else f"max diff {difference:.3g}"
        graphs[algo.label] = graph_of(lambda w, a=algo: product.run(x, w, a), copies)
    times: dict[str, list[float]] = {label: [] for label in graphs}
    for _ in range(args.rounds):
        for label, graph in graphs.items():
            clocks.phase(f"{rows} {name} {label}")
            times[label].append(sustained_us(graph, args.sustain_ms, copies_count) if args.sustain_ms
                                else timed_us(graph, args.replays, copies_count))
            clocks.phase("between")
    seen = clocks.summary()
    medians = {label: statistics.median(values) for label, values in times.items()}
    best = min((label for label in medians if label != "F.linear"), key=medians.get, default=None)
    flops = 2 * rows * out_features * in_features
    base = medians["F.linear"]

    def clock(label: str) -> str:
        phase = seen.get(f"{rows} {name} {label}")
        return f"  [{phase['sm_mhz_median']:.0f} MHz, {phase['watts_median']:.0f} W]" if phase else ""

    print(f"rows {rows:>3} {name:<8} F.linear {base:8.2f} us ({weight_bytes / base / 1e6:5.2f} TB/s, "
          f"{flops / base / 1e6:6.1f} TFLOP/s){clock('F.linear')}", flush=True)
    for label in sorted(medians, key=medians.get)[: args.show]:
        if label != "F.linear":
            print(f"    {label:<40} {medians[label]:8.2f} us  {base / medians[label]:.3f}x  {notes[label]}"
                  f"{clock(label)}", flush=True)
    del graphs
    torch.cuda.empty_cache()
    return {"rows": rows, "shape": name, "f_linear_us": base, "best": best,
            "best_us": medians[best] if best else None, "best_note": notes.get(best), "all_us": medians,
            "notes": notes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,64,256")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--candidates", type=int, default=8, help="per workspace limit of the heuristic")
    parser.add_argument("--copies", type=int, default=12, help="most distinct weights a graph (at least 3 GB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--reductions", type=lambda v: int(v, 0), default=None,
                        help="the heuristic's reduction scheme mask (`helios.abi.cublaslt._REDUCTIONS`; 0x7 all)")
    parser.add_argument("--sustain-ms", type=float, default=0.0,
                        help="replay each graph back to back for about this long a round, timed over the second half")
    parser.add_argument("--show", type=int, default=6, help="fastest candidates printed per shape")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not available():
        print("cublaslt_ab: needs a CUDA device and cuBLASLt")
        return 1
    if args.reductions is not None:
        import helios.abi.cublaslt as cublaslt

        cublaslt._REDUCTIONS = args.reductions
    print(f"reduction mask {args.reductions}; device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    with ClockLog() as clocks:
        for rows in (int(r) for r in args.rows.split(",")):
            report(rows, [measure(rows, name, args, clocks) for name in args.shapes.split(",")])
    return 0


def report(rows: int, results: list[dict]) -> None:
    base = sum(r["f_linear_us"] * PER_STEP[r["shape"]] for r in results) / 1e3
    best = sum(min(r["f_linear_us"], r["best_us"] or r["f_linear_us"]) * PER_STEP[r["shape"]] for r in results) / 1e3
    print(f"rows {rows}: the step's projections {base:.3f} ms on F.linear, {best:.3f} ms on the best "
          f"candidates ({base / best:.3f}x, {base - best:.3f} ms a step)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""The floor a power-capped decode step cannot go under: its matrix products alone, sustained (CUDA).

At 256 rows both the served step and the compiled anchor's run at the H200's software power cap
(about 690 W, the SM clock 1,500-1,650 MHz instead of 1,980), so a step's time is about its energy
over the cap. Both sides call the same cuBLAS products (the fused qkv, output, gate/up and down
projections of 32 layers and the LM head); what else a step does (attention, norms, SiLU-mul,
sampling) is where the two differ. This bench captures those products alone, on distinct
Llama-3.1-8B-shaped bfloat16 weights per layer (each read from HBM once a step, as in decode), in
one CUDA graph, and replays it back to back for `--sustain-s` seconds: the device ms of a step
that did nothing but its products, at the clock the cap holds.

With the JSON of a `bench/anchor_compare.py` run from the same device call (`--anchor-json`) it
prints the anchor's step over this floor (the most any implementation of the same products could
gain on the anchor here) beside Helios's served step over it (`step_timing`'s device ms), and
what share of the served step the rest takes.

    python bench/power_floor.py [--rows 256] [--layers 32] [--sustain-s 4] [--anchor-json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_clocks import ClockLog  # noqa: E402
from lever_ab import captured_graph  # noqa: E402

from helios.runtime.loading.gemm_algos import sustained_replay_us  # noqa: E402

HIDDEN, QKV, FFN, VOCAB = 4096, 6144, 14336, 128256


def products_graph(rows: int, layers: int, alike: bool = False):
    """(the CUDA graph of one step's products, the tensors it holds): per layer the fused qkv, the
    output projection, the fused gate/up and the down projection, then the LM head; on random rows,
    or (`alike`) on one random row repeated, as a graph replayed on padding rows reads."""
    make = lambda out, depth: torch.randn(out, depth, device="cuda", dtype=torch.bfloat16) * 0.02  # noqa: E731
    weights = [(make(QKV, HIDDEN), make(HIDDEN, HIDDEN), make(2 * FFN, HIDDEN), make(HIDDEN, FFN))
               for _ in range(layers)]
    head = make(VOCAB, HIDDEN)
    x = torch.randn(1 if alike else rows, HIDDEN, device="cuda", dtype=torch.bfloat16).expand(rows, -1).contiguous()
    wide = torch.randn(1 if alike else rows, FFN, device="cuda", dtype=torch.bfloat16).expand(rows, -1).contiguous()

    def step():
        for qkv, out, gate_up, down in weights:
            F.linear(x, qkv)
            F.linear(x, out)
            F.linear(x, gate_up)
            F.linear(wide, down)
        F.linear(x, head)

    return captured_graph(step), (weights, head, x, wide)


def replay_ms(graph, seconds: float) -> tuple[float, float]:
    """(median ms of one replay after a rest, mean ms a replay over the second half of back-to-back
    replays lasting about `seconds`)."""
    rested = []
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # about 0.1 s of idle device: the clock recovers
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        rested.append(start.elapsed_time(end))
    count = max(8, round(seconds * 1e3 / max(rested[-1], 1e-3)))
    return statistics.median(rested), sustained_replay_us(graph, count) / 1e3


def sustained_floor(args, alike: bool) -> float:
    """The median over `args.rounds` of the products' sustained ms a step (`replay_ms`), on random
    rows or (`alike`) on one row repeated, each round's times and the clocks printed."""
    graph, _held = products_graph(args.rows, args.layers, alike)
    what = ("products alone on one row repeated" if alike
            else f"products alone, {args.rows} rows, {args.layers} layers + LM head")
    floors = []
    with ClockLog() as clocks:
        for round_ in range(args.rounds):
            clocks.phase(f"{'alike rows, ' if alike else ''}round {round_}")
            rested, sustained = replay_ms(graph, args.sustain_s)
            floors.append(sustained)
            print(f"{what}: rested {rested:.3f} ms, sustained {sustained:.3f} ms a step", flush=True)
    for line in clocks.describe():
        print(line, flush=True)
    floor = statistics.median(floors)
    if not alike:
        print(f"floor (median sustained): {floor:.3f} ms a step", flush=True)
    return floor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="decode rows")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--sustain-s", type=float, default=4.0, help="seconds of back-to-back replays")
    parser.add_argument("--rounds", type=int, default=3, help="sustained runs (each after a rest)")
    parser.add_argument("--anchor-json", type=Path, help="bench/anchor_compare.py's --json from the same call")
    parser.add_argument("--alike-rows", action="store_true",
                        help="also time the products on one row repeated (what a replay on padding rows computes): "
                             "the power a step draws depends on its data")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if args.rows < 1 or args.layers < 1 or args.sustain_s <= 0 or args.rounds < 1:
        parser.error("--rows, --layers, --rounds at least 1 and --sustain-s above 0")
    torch.manual_seed(0)
    floor = sustained_floor(args, alike=False)
    if args.alike_rows:
        alike = sustained_floor(args, alike=True)
        print(f"one row repeated, sustained: {alike:.3f} ms a step, {floor / alike:.3f}x faster than on random rows",
              flush=True)
    if args.anchor_json is not None:
        report = json.loads(args.anchor_json.read_text())
        anchor = report.get("anchor", {}).get(str(args.rows), {}).get("step_ms")
        timing = report.get("step_timing", {}).get(str(args.rows), {})
        served = timing.get("device_ms")
        if anchor:
            print(f"anchor step {anchor:.3f} ms: {anchor / floor:.3f}x the floor (the most the same products "
                  "could gain on it)", flush=True)
        if served:
            print(f"Helios served step {served:.3f} ms (median device): {served / floor:.3f}x the floor; the rest of "
                  f"the step {1 - floor / served:.1%} of it", flush=True)
        if anchor and served:
            print(f"anchor step / Helios's median device step {anchor / served:.3f}x; at the floor "
                  f"{anchor / floor:.3f}x", flush=True)
        if anchor and timing.get("span_step_ms"):
            span = timing["span_step_ms"]
            print(f"Helios's full steps end to end {span:.3f} ms a step (idle and slower steps in): "
                  f"{span / floor:.3f}x the floor; anchor step / it {anchor / span:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

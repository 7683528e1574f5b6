"""Programmatic dependent launch (PDL) for a 64-row decode layer's kernels, A/B in one process (CUDA).

A chain of 32 layers shaped like Llama-3.1-8B at 64 rows, each: add + RMSNorm (Triton), the fused
qkv and output projections (cuBLAS; the output one reads q in place of attention's result), add +
RMSNorm, the gate/up product with the SiLU-mul fused (`skinny_silu`) and the down product
(`skinny`), distinct weights per layer, captured in one CUDA graph per variant:

- ``off``: the kernels as capture binds them now;
- ``pdl``: the Triton kernels launched with PDL: each lets the next kernel start at once and waits
  for the previous one's writes before it reads anything (``griddepcontrol``), so the next kernel's
  programs take SMs as this one's last wave drains;
- ``pdl+prefetchN``: also, before waiting, each skinny program asks L2 for the first N columns of
  its weight rows (the weights are never written), so its first loads hit L2;
- ``pdl+prefetchN+qkv/o``: the qkv and output projections on the skinny kernel too (64x32x128).

Reported: device ms per replay of the 32 layers, medians of --rounds alternated rounds (--replays
each), the ratio against ``off``, and whether the final hidden state equals ``off``'s bit for bit.

    python bench/pdl_ab.py [--layers 32] [--rows 64] [--rounds 7] [--replays 20] [--prefetch 256,512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from helios.abi.gemv_tiles import SkinnyTile  # noqa: E402
from helios.abi.triton_fused import triton_rms_norm  # noqa: E402
from helios.abi.triton_skinny import skinny, skinny_silu  # noqa: E402

HIDDEN, QKV, FFN = 4096, 6144, 14336
GATE_UP, DOWN, NARROW = (SkinnyTile.parse(label) for label in ("64x128x128/1w8s4", "64x32x128/1w4s6", "64x32x128/1w4s6"))


def layer_weights(layers: int, device) -> list[dict]:
    def weight(rows, cols):
        return (torch.randn(rows, cols, device=device) / cols ** 0.5).to(torch.bfloat16)
    return [dict(qkv=weight(QKV, HIDDEN), o=weight(HIDDEN, HIDDEN), gate_up=weight(2 * FFN, HIDDEN),
                 down=weight(HIDDEN, FFN), norm1=torch.ones(HIDDEN, device=device, dtype=torch.bfloat16),
                 norm2=torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)) for _ in range(layers)]


def forward(hidden: torch.Tensor, weights: list[dict], pdl: bool, prefetch: int, narrow: bool) -> torch.Tensor:
    delta = torch.zeros_like(hidden)
    for w in weights:
        hidden, normed = triton_rms_norm(hidden, delta, w["norm1"], 1e-5, pdl=pdl)
        if narrow:
            qkv = skinny(normed, w["qkv"], None, NARROW, pdl=pdl, prefetch=prefetch)
            out = skinny(qkv[:, :HIDDEN], w["o"], None, NARROW, pdl=pdl, prefetch=prefetch)
        else:
            qkv = F.linear(normed, w["qkv"])
            out = F.linear(qkv[:, :HIDDEN], w["o"])
        hidden, normed = triton_rms_norm(hidden, out, w["norm2"], 1e-5, pdl=pdl)
        act = skinny_silu(normed, w["gate_up"], GATE_UP, pdl=pdl, prefetch=prefetch)
        delta = skinny(act, w["down"], None, DOWN, pdl=pdl, prefetch=prefetch)
    return hidden + delta


def captured(run, hidden: torch.Tensor):
    """(graph, its output) for `run(hidden)` after two warm-up calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run(hidden)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(hidden)
    return graph, out


def timed(graph, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="layers in the chain")
    parser.add_argument("--rows", type=int, default=64, help="rows (decode batch)")
    parser.add_argument("--rounds", type=int, default=7, help="alternated timing rounds")
    parser.add_argument("--replays", type=int, default=20, help="graph replays per round")
    parser.add_argument("--prefetch", default="256,512", help="comma-separated prefetch widths (columns)")
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    weights = layer_weights(args.layers, device)
    hidden = torch.randn(args.rows, HIDDEN, device=device).to(torch.bfloat16)
    variants = {"off": (False, 0, False), "pdl": (True, 0, False)}
    for width in (int(w) for w in args.prefetch.split(",") if w):
        variants[f"pdl+prefetch{width}"] = (True, width, False)
        variants[f"pdl+prefetch{width}+qkv/o"] = (True, width, True)
    variants["skinny qkv/o"] = (False, 0, True)
    graphs = {}
    for name, (pdl, prefetch, narrow) in variants.items():
        graphs[name] = captured(lambda h, p=pdl, f=prefetch, n=narrow: forward(h, weights, p, f, n), hidden)
    times = {name: [] for name in graphs}
    for name, (graph, _) in graphs.items():
        timed(graph, 3)
    for _ in range(args.rounds):
        for name, (graph, _) in graphs.items():
            times[name].append(timed(graph, args.replays))
    for name, (graph, _) in graphs.items():
        graph.replay()
    torch.cuda.synchronize()
    reference = graphs["off"][1]
    base = statistics.median(times["off"])
    print(f"PDL A/B: {args.layers} layers at {args.rows} rows, medians of {args.rounds} rounds of {args.replays} replays")
    for name, (graph, out) in graphs.items():
        ms = statistics.median(times[name])
        same = torch.equal(out, reference) if not variants[name][2] else "n/a (other kernel)"
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        print(f"PDL {name:24s} {ms:7.3f} ms ({spread})  {base / ms:5.3f}x  same bits as off: {same}")


if __name__ == "__main__":
    main()

"""The packed projection kernel against torch's linear (MKL's sgemm) at a model's projection shapes
(not a test).

Each round calls every projection of `--layers` layers of distinct random weights once, as a decode
step streams them (so the weights come from the caches a step leaves them in, not from L1), through
torch's linear and through `helios.runtime.loading.linear_kernel` over the same weights packed,
alternated; prints each row count's median ms a round, GFLOP/s and the ratio, and checks the two
agree within float rounding. One thread unless `--threads`.

    .venv/bin/python bench/linear_kernel_ab.py [--shape llama4|embedded|8b] [--rows 1,4,16,64] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from helios.runtime.loading import linear_kernel
from helios.runtime.loading.linear_kernel import build_kernel, linear_body, pack

# hidden, intermediate, q + 2 kv widths, layers: the 4-layer random Llama, the embedded model, an 8B layer
SHAPES = {"llama4": (256, 512, 512, 4), "embedded": (128, 384, 256, 4), "8b": (4096, 14336, 6144, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama4", choices=sorted(SHAPES), help="projection shapes")
    parser.add_argument("--rows", default="1,4,16,64", help="comma-separated row counts")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=15, help="alternated rounds; medians reported")
    parser.add_argument("--layers", type=int, help="layers of distinct weights (default: the shape's)")
    parser.add_argument("--parallel-macs", type=int, default=linear_kernel.PARALLEL_MACS,
                        help="multiply-adds from which a call splits over threads (linear_kernel.PARALLEL_MACS)")
    args = parser.parse_args()
    linear_kernel.PARALLEL_MACS = args.parallel_macs
    torch.set_num_threads(args.threads)
    hidden, intermediate, qkv, layers = SHAPES[args.shape]
    layers = args.layers or layers
    kernel = build_kernel()
    shapes = [(qkv, hidden), (hidden, hidden), (2 * intermediate, hidden), (hidden, intermediate)]
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(out, inner, generator=generator) * inner ** -0.5
               for _ in range(layers) for out, inner in shapes]
    bodies = [linear_body(kernel, w, pack(w)) for w in weights]
    flops_per_row = 2 * sum(w.numel() for w in weights)
    print(f"torch {torch.__version__}, {args.threads} thread(s) from {args.parallel_macs:,} multiply-adds, {args.shape}: {len(weights)} projections, "
          f"{sum(w.numel() for w in weights) * 4 / 1e6:.1f} MB of weights, median of {args.rounds} rounds")
    print(f"{'rows':>5} {'torch ms':>9} {'kernel ms':>10} {'torch GF/s':>11} {'kernel GF/s':>12} {'ratio':>6}")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {inner: torch.randn(rows, inner, generator=generator) for inner in {s[1] for s in shapes}}
        for w, body in zip(weights, bodies):
            x = inputs[w.shape[1]]
            torch.testing.assert_close(body(x, w), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4)

        def torch_round():
            for w in weights:
                torch.nn.functional.linear(inputs[w.shape[1]], w)

        def kernel_round():
            for w, body in zip(weights, bodies):
                body(inputs[w.shape[1]], w)

        times: dict[str, list[float]] = {"torch": [], "kernel": []}
        for _ in range(args.rounds):
            for name, call in (("torch", torch_round), ("kernel", kernel_round)):
                started = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - started)
        plain, packed = statistics.median(times["torch"]), statistics.median(times["kernel"])
        flops = flops_per_row * rows
        print(f"{rows:>5} {plain * 1e3:>9.3f} {packed * 1e3:>10.3f} {flops / plain / 1e9:>11.1f} "
              f"{flops / packed / 1e9:>12.1f} {plain / packed:>6.2f}")


if __name__ == "__main__":
    main()

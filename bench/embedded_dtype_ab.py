"""The embedded default model's core in float32 (as `helios serve` prepares it) against the same
checkpoint prepared in bfloat16, on the CPU (not a test).

Both cores load with the default options (the C++ kernels where a compiler builds them: they take
float32), decode the same greedy workload interleaved in one process, one thread; prints the best
of `--repeats` tok/s of each and float32 / bfloat16.

    .venv/bin/python bench/embedded_dtype_ab.py [--batches 1,16] [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate_vs_hf import NAMESPACE, PROMPT_TOKENS, Best, helios_run, prepared, timed  # noqa: E402

from helios.core.reader import open_core  # noqa: E402
from helios.embedded import default_model_dir  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

DTYPES = ("float32", "bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each, interleaved; best reported")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        engines = {}
        for dtype in DTYPES:
            core, key = prepared(f"embedded-{dtype}", default_model_dir(), Path(scratch), args.tokens, batches, dtype)
            engines[dtype] = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]),
                                           RuntimeOptions()).engine
        print(f"torch {torch.__version__}, 1 thread, embedded model, {args.tokens} greedy tokens a request, "
              f"best of {args.repeats}")
        print(f"{'batch':>5} {'float32 tok/s':>14} {'bfloat16 tok/s':>15} {'float32 / bfloat16':>19}")
        for batch in batches:
            prompts = [[(b * 13 + i) % 1000 + 3 for i in range(PROMPT_TOKENS)] for b in range(batch)]
            best = {dtype: Best() for dtype in DTYPES}
            for engine in engines.values():
                helios_run(engine, prompts[:1], 4)  # warm-up
            for _ in range(args.repeats):
                for dtype, engine in engines.items():
                    wall, cpu, (count, _) = timed(lambda: helios_run(engine, prompts, args.tokens))
                    best[dtype].update(wall, cpu, count)
            full, half = best["float32"].wall, best["bfloat16"].wall
            print(f"{batch:>5} {1 / full:>14.1f} {1 / half:>15.1f} {half / full:>19.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Where a CPU decode step's time goes (not a test): the engine's phases and the program's calls.

Prepares the benchmark's model (the embedded default model or a 4-layer random Llama, as
`bench/generate_vs_hf.py` does), runs --batch greedy requests of 8 prompt tokens for --tokens
outputs through `helios.runtime.offline.generate`, and reports thread CPU time per step (steadier
than wall time on a shared machine; best of --repeats runs):

- the engine's phases: scheduling, packing, the program call, the completion's validation
  (`finish`), the scheduler's completion, and everything else (events, bookkeeping);
- the decode program's calls at that batch, grouped by callee (each call of its fast graph timed
  on its own, so the total exceeds the untimed call by the timers' cost), largest first.

By default the programs' ABI bodies run through C++ kernels where a compiler builds them
(`helios.runtime.loading.cpu_kernels`); --bodies profiles the Python bodies instead. With
--compile-programs the engine's programs are compiled by Inductor at load
(`helios.runtime.loading.program_compile`) and the compiled graph's calls are listed (a compiled
segment is one call).

    .venv/bin/python bench/cpu_step_profile.py [--model embedded|llama4] [--batch 16] [--tokens 64]
        [--repeats 5] [--rows 25] [--compile-programs] [--bodies]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from random_llama import SMOKE, with_layers, write_random_llama  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.embedded import default_model_dir  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

NAMESPACE = "bench/cpu-step"
PHASES = (("schedule", "scheduler", "schedule"), ("pack", "packer", "pack"), ("program", "executor", "_call"),
          ("finish", "executor", "finish"), ("complete", "scheduler", "complete"))


def _engine(model: str, batch: int, tokens: int, scratch: Path, compiled: bool = False, bodies: bool = False,
            dtype: str = "float32"):
    checkpoint = default_model_dir() if model == "embedded" else write_random_llama(
        scratch / "llama4", with_layers(SMOKE, 4), torch.float32)
    key = SigningKey.generate()
    plan = CapacityPlan(context_tokens=8 + tokens + 8, prefill_tokens=64, decode_batches=tuple(sorted({1, batch})))
    prepare_core(checkpoint, scratch / "bench.core", key, PrepareOptions(NAMESPACE, capacities=plan, dtype=dtype))
    options = RuntimeOptions(load=LoadOptions(compile_programs=compiled, cpu_kernels=False if bodies else None))
    return build_runtime(open_core(scratch / "bench.core", accept=NAMESPACE, trusted_keys=[key.public]), options).engine


def _timed(owner, name: str, totals: dict, key: str) -> None:
    """Wraps `owner.name` so that its thread CPU time adds to totals[key]."""
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        started = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.thread_time() - started
    setattr(owner, name, timed)


def phases(engine, prompts, tokens: int, repeats: int) -> tuple[float, dict]:
    """(seconds per step, {phase: seconds per step}) of the fastest of `repeats` runs."""
    owners = {"scheduler": engine.scheduler, "packer": engine.executor.packer, "executor": engine.executor}
    totals: dict = collections.defaultdict(float)
    for label, owner, name in PHASES:
        _timed(owners[owner], name, totals, label)
    best = None
    for _ in range(repeats):
        totals.clear()
        started = time.thread_time()
        generate(engine, prompts, tokens)
        total = time.thread_time() - started
        if best is None or total < best[0]:
            best = (total, dict(totals))
    steps = tokens + 1  # one prefill step, then one decode step per further token
    return best[0] / steps, {k: v / steps for k, v in best[1].items()}


def program_calls(engine, prompts, tokens: int, batch: int) -> tuple[int, dict, collections.Counter]:
    """(decode steps, {callee: seconds}, {callee: calls}) of the batch's decode program, each call
    of its fast graph timed."""
    totals: dict = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    program = next(p for p in engine.executor.model.programs if p.graph == "decode" and p.batch_capacity == batch)
    fast = program.module.compiled if program.module.compiled is not None else program.module.fast
    for node in fast.graph.nodes:
        if node.op == "call_function":
            node.target = _counted(node.target, getattr(node.target, "__name__", str(node.target)), totals, counts)
    fast.recompile()
    totals.clear()
    counts.clear()
    generate(engine, prompts, tokens)
    return tokens - 1, totals, counts


def _counted(function, key: str, totals: dict, counts: collections.Counter):
    def counted(*args, **kwargs):
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            totals[key] += time.thread_time() - started
            counts[key] += 1
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", choices=("embedded", "llama4"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25, help="program callees listed")
    parser.add_argument("--compile-programs", action="store_true", help="compile the programs with Inductor at load")
    parser.add_argument("--bodies", action="store_true",
                        help="the ABI ops' Python bodies, without the C++ kernels bound by default")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the core's dtype")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        engine = _engine(args.model, args.batch, args.tokens, Path(scratch), args.compile_programs, args.bodies,
                         args.dtype)
        prompts = [[(b * 13 + i) % 500 + 3 for i in range(8)] for b in range(args.batch)]
        generate(engine, prompts, 4)  # warm-up: the programs' checked first calls
        total, split = phases(engine, prompts, args.tokens, args.repeats)
        other = total - sum(split.values())
        print(f"{args.model}, batch {args.batch}, {args.tokens} tokens, thread CPU time per step (best of {args.repeats}): "
              f"{1e6 * total:.0f} us")
        print("  " + ", ".join(f"{k} {1e6 * v:.0f}" for k, v in split.items()) + f", other {1e6 * other:.0f} us")
        steps, totals, counts = program_calls(engine, prompts, args.tokens, args.batch)
        timed = sum(totals.values())
        print(f"decode program calls per step (timed one by one: {1e6 * timed / steps:.0f} us in {sum(counts.values()) // steps} calls)")
        for key, seconds in sorted(totals.items(), key=lambda item: -item[1])[:args.rows]:
            print(f"  {key:40s} {1e6 * seconds / steps:8.1f} us  {counts[key] / steps:5.1f} calls  "
                  f"{1e6 * seconds / counts[key]:6.1f} us/call")


if __name__ == "__main__":
    main()

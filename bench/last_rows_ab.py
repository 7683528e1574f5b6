"""Same-process A/B of prompt programs that run the last layer's output projection and MLP on each
row's last token only (`GenerationProgram.last_rows_only`, the default) against programs that run
the whole last layer (not a test).

For each model (the embedded default model and a 4-layer random Llama, as `bench/generate_vs_hf.py`
builds them) the checkpoint is prepared twice, once as the default and once with the whole last
layer, and both engines (eager, or with --compile-programs compiled at load) answer the same
request, --prompt-tokens prompt tokens and one output token (the time to first token, cold: every
request a new prompt), alternating which goes first, --repeats times each. Prints each side's median
wall and process CPU time per request, the median of the per-pair ratios (last rows / whole), and
whether both sides gave the same first tokens.

    .venv/bin/python bench/last_rows_ab.py [--models embedded,llama4] [--prompt-tokens 480]
        [--repeats 9] [--threads 1] [--compile-programs] [--glibc-thresholds]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from generate_vs_hf import NAMESPACE, checkpoints, helios_run, timed  # noqa: E402

from helios.contract import StartupOptions  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.ignition.program import GenerationProgram  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

SIDES = ("last rows", "whole")


def prepared(checkpoint: Path, core: Path, key, plan: CapacityPlan, last_rows_only: bool) -> Path:
    default = GenerationProgram.last_rows_only
    GenerationProgram.last_rows_only = last_rows_only
    try:
        prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, capacities=plan, dtype="float32"))
    finally:
        GenerationProgram.last_rows_only = default
    return core


def engine_of(core: Path, key, args):
    load = LoadOptions(StartupOptions(token_logprobs=False), compile_programs=args.compile_programs)
    options = RuntimeOptions(load=load, hold_freed_memory=not args.glibc_thresholds)
    return build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options).engine


def compare(name: str, checkpoint: Path, scratch: Path, args) -> None:
    key = SigningKey.generate()
    plan = CapacityPlan(context_tokens=args.prompt_tokens + 16, prefill_tokens=args.prompt_tokens, decode_batches=(1,))
    engines = {side: engine_of(prepared(checkpoint, scratch / f"{name}-{i}.core", key, plan, side == SIDES[0]), key, args)
               for i, side in enumerate(SIDES)}
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    times = {side: ([], []) for side in SIDES}
    firsts = {side: [] for side in SIDES}
    for repeat in range(args.repeats + 1):
        prompt = [[(repeat * 31 + i * 7) % (vocab - 3) + 3 for i in range(args.prompt_tokens)]]
        order = SIDES if repeat % 2 == 0 else SIDES[::-1]
        for side in order:
            wall, cpu, (_, tokens) = timed(lambda: helios_run(engines[side], prompt, 1))
            if repeat:  # the first round warms both
                times[side][0].append(wall)
                times[side][1].append(cpu)
                firsts[side].append(tokens[0][0])
    mine, theirs = times[SIDES[0]], times[SIDES[1]]
    wall_ratio = statistics.median(a / b for a, b in zip(mine[0], theirs[0]))
    cpu_ratio = statistics.median(a / b for a, b in zip(mine[1], theirs[1]))
    same = sum(a == b for a, b in zip(firsts[SIDES[0]], firsts[SIDES[1]]))
    print(f"{name:9s} {args.prompt_tokens:6d}  {1e3 * statistics.median(mine[0]):9.2f}  "
          f"{1e3 * statistics.median(theirs[0]):9.2f}  {wall_ratio:10.3f}  {cpu_ratio:9.3f}  {same}/{args.repeats}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="embedded,llama4", help="comma-separated: embedded, llama4")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint directory instead of --models")
    parser.add_argument("--prompt-tokens", type=int, default=480, help="prompt length (one request, cold)")
    parser.add_argument("--repeats", type=int, default=9, help="timed requests per side (after one warm-up each)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--compile-programs", action="store_true", help="compile the CPU programs at load")
    parser.add_argument("--glibc-thresholds", action="store_true",
                        help="build the engines without RuntimeOptions.hold_freed_memory (glibc malloc's moving thresholds)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("model     prompt  last rows ms  whole ms  wall ratio  cpu ratio  same first token")
    with tempfile.TemporaryDirectory() as scratch:
        for name, checkpoint in checkpoints(args, Path(scratch)):
            compare(name, checkpoint, Path(scratch), args)


if __name__ == "__main__":
    main()

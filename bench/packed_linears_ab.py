"""Same-process A/B of oneDNN-packed projections in compiled CPU programs (not a test).

Prepares the benchmark's models as `bench/generate_vs_hf.py` does (the embedded default model and
a 4-layer random Llama), loads two engines with their programs compiled by Inductor at load: one
whose projections all stay ``aten.linear`` ("plain") and one where `packed_linears` packs those it
measures faster ("packed", the default), and runs both and transformers' `generate` on the same
greedy workload, interleaved, --repeats times each. Prints, per model and batch, each side's best
tokens per second (wall) and its ratio to transformers in wall and process CPU time (best of the
runs), the median of the per-run ratios packed / plain (wall and CPU), the projections packed, and
whether all three gave the same tokens.

    .venv/bin/python bench/packed_linears_ab.py [--models embedded,llama4] [--batches 1,16]
        [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from generate_vs_hf import NAMESPACE, PROMPT_TOKENS, checkpoints, helios_run, hf_run, prepared, timed  # noqa: E402

from helios.contract import StartupOptions  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading import packed_linears  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402


def _compiled(core: Path, key, packing: bool):
    options = RuntimeOptions(load=LoadOptions(StartupOptions(token_logprobs=False), compile_programs=True))
    original = packed_linears.packing_pays
    if not packing:
        packed_linears.packing_pays = lambda rows, weight, bias: False
    try:
        started = time.perf_counter()
        engine = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options).engine
    finally:
        packed_linears.packing_pays = original
    count = sum(1 for p in engine.executor.model.programs if p.module.__class__.__name__ == "CpuProgram"
                and p.module.compiled is not None
                for n in p.module.compiled.graph.nodes if n.op == "call_function" and n.target is packed_linears.packed_linear)
    print(f"  ({'packed' if packing else 'plain'} engine loaded in {time.perf_counter() - started:.1f} s, "
          f"{count} projections packed)", flush=True)
    return engine


def compare(name: str, checkpoint: Path, scratch: Path, args, batches: list[int]) -> None:
    core, key = prepared(name, checkpoint, scratch, args.tokens, batches, "float32")
    engines = {"plain": _compiled(core, key, False), "packed": _compiled(core, key, True)}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    for batch in batches:
        prompts = [[(b * 13 + i) % (vocab - 3) + 3 for i in range(PROMPT_TOKENS)] for b in range(batch)]
        runs = {label: (lambda e=engine: helios_run(e, prompts, args.tokens)) for label, engine in engines.items()}
        runs["transformers"] = lambda: hf_run(model, prompts, args.tokens)
        for run in runs.values():
            run()  # warm-up
        per_run: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
        tokens = {}
        for _ in range(args.repeats):
            for label, run in runs.items():
                wall, cpu, (count, tokens[label]) = timed(run)
                per_run[label].append((wall / count, cpu / count))
        theirs = per_run["transformers"]
        best = {label: (min(w for w, _ in values), min(c for _, c in values)) for label, values in per_run.items()}
        same = sum(all(tokens[label][row] == tokens["transformers"][row] for label in runs) for row in range(batch))
        line = f"{name:9s} {batch:5d}"
        for label in ("plain", "packed"):
            line += (f"  {1 / best[label][0]:9.1f}  {best['transformers'][0] / best[label][0]:5.2f}"
                     f" ({best['transformers'][1] / best[label][1]:4.2f})")
        wall = statistics.median(p[0] / q[0] for p, q in zip(per_run["packed"], per_run["plain"]))
        cpu = statistics.median(p[1] / q[1] for p, q in zip(per_run["packed"], per_run["plain"]))
        print(f"{line}  {1 / best['transformers'][0]:9.1f}   {wall:5.3f} ({cpu:5.3f})  {same:3d}/{batch}", flush=True)
        del theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="embedded,llama4", help="comma-separated: embedded, llama4")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint directory instead of --models")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        print(f"torch {torch.__version__}, {args.threads} thread(s), float32, {args.tokens} tokens per request, greedy, "
              f"{args.repeats} interleaved runs; tok/s and ratio to transformers: best run, wall (process CPU)")
        print("model     batch  plain tok/s  ratio (cpu)  packed tok/s  ratio (cpu)  hf tok/s   packed/plain median wall (cpu)  same")
        for name, checkpoint in checkpoints(args, Path(scratch)):
            compare(name, checkpoint, Path(scratch), args, batches)


if __name__ == "__main__":
    main()

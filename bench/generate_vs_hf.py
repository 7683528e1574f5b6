"""CPU decode throughput of Helios against Hugging Face `generate` on the same weights, same process.

For each model (default: the embedded default model and a 4-layer random Llama from
`bench/random_llama.py`; or `--checkpoint DIR`) the checkpoint is prepared into a core in --dtype
(float32 by default, the dtype transformers runs in here too), then for each batch size the same
greedy workload (8-token prompts, --tokens outputs each) runs through the Helios runtime
(`helios.runtime.offline.generate`, the engine driven in this thread) and through transformers'
`generate`, interleaved, --repeats times each; the best run of each is reported as output tokens
per second, with the ratio Helios / transformers (wall clock) and the same ratio of process CPU
time per token (steadier on a shared machine). Both use the same torch thread count (--threads)
and the same malloc thresholds: building an engine fixes them for the whole process
(`RuntimeOptions.hold_freed_memory`) before transformers runs; --glibc-thresholds leaves glibc's
moving ones.
"same" counts requests whose Helios tokens equal transformers' greedy tokens; "target" is issue
#18's goal for the ratio (1.0x at batch 1, 1.5x at batch 16).

The engine binds the C++ kernels for its ABI bodies where a C++ compiler builds them (the default,
`helios.runtime.loading.cpu_kernels`); --bodies adds an engine without them (`cpu_kernels=False`,
the Python bodies), run interleaved too ("bodies" columns).

With --compile-programs a second engine loads the same core with its CPU programs compiled by
Inductor at load (`helios.runtime.loading.program_compile`; without the token-logprobs variants,
which this workload never runs), its load time is printed, and the three run interleaved: the
table then gives both engines' rates and ratios ("compiled" columns; "same" counts requests whose
tokens of both engines equal transformers').

    .venv/bin/python bench/generate_vs_hf.py [--models embedded,llama4] [--checkpoint DIR]
        [--batches 1,16] [--tokens 64] [--threads 1] [--repeats 5] [--dtype float32] [--compile-programs]
        [--bodies]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from random_llama import SMOKE, with_layers, write_random_llama  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.embedded import default_model_dir  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.contract import StartupOptions  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

NAMESPACE = "bench/hf"
PROMPT_TOKENS = 8
TARGETS = {1: "1.0x", 16: "1.5x"}  # issue #18's CPU row: Helios / transformers


@dataclass
class Best:
    """The fastest of several timed runs: wall and process CPU seconds per output token."""

    wall: float = float("inf")
    cpu: float = float("inf")

    def update(self, wall: float, cpu: float, tokens: int) -> None:
        self.wall, self.cpu = min(self.wall, wall / tokens), min(self.cpu, cpu / tokens)


def timed(run) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def helios_run(engine, prompts, tokens: int) -> tuple[int, list[list[int]]]:
    results = generate(engine, prompts, tokens)
    return sum(len(r.token_ids) for r in results), [list(r.token_ids) for r in results]


def hf_run(model, prompts, tokens: int) -> tuple[int, list[list[int]]]:
    ids = torch.tensor(prompts)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    generated = out[:, ids.shape[1]:]
    return generated.numel(), generated.tolist()


def compiled_engine(core: Path, key, args):
    options = RuntimeOptions(load=LoadOptions(StartupOptions(token_logprobs=False), compile_programs=True),
                             hold_freed_memory=not args.glibc_thresholds)
    started = time.perf_counter()
    engine = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options).engine
    print(f"  (compiled engine loaded in {time.perf_counter() - started:.1f} s)", flush=True)
    return engine


def prepared(name: str, checkpoint: Path, scratch: Path, tokens: int, batches: list[int], dtype: str):
    """(the core of `checkpoint` for this workload, prepared in `dtype` under `scratch`, its signing key)."""
    key = SigningKey.generate()
    core = scratch / f"{name}.core"
    plan = CapacityPlan(context_tokens=PROMPT_TOKENS + tokens + 8, prefill_tokens=64,
                        decode_batches=tuple(sorted(set(batches))))
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, capacities=plan, dtype=dtype))
    return core, key


def compare(name: str, checkpoint: Path, scratch: Path, args, batches: list[int]) -> None:
    core, key = prepared(name, checkpoint, scratch, args.tokens, batches, args.dtype)
    engine = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]),
                           RuntimeOptions(hold_freed_memory=not args.glibc_thresholds)).engine
    compiled = compiled_engine(core, key, args) if args.compile_programs else None
    bodies = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]),
                           RuntimeOptions(load=LoadOptions(cpu_kernels=False),
                                          hold_freed_memory=not args.glibc_thresholds)).engine if args.bodies else None
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=getattr(torch, args.dtype)).eval()
    vocab = model.config.vocab_size
    for batch in batches:
        prompts = [[(b * 13 + i) % (vocab - 3) + 3 for i in range(PROMPT_TOKENS)] for b in range(batch)]
        runs = {"helios": lambda: helios_run(engine, prompts, args.tokens),
                "transformers": lambda: hf_run(model, prompts, args.tokens)}
        if compiled is not None:
            runs["compiled"] = lambda: helios_run(compiled, prompts, args.tokens)
        if bodies is not None:
            runs["bodies"] = lambda: helios_run(bodies, prompts, args.tokens)
            helios_run(bodies, prompts[:1], 4)
        helios_run(engine, prompts[:1], 4)  # warm-up
        hf_run(model, prompts[:1], 4)
        if compiled is not None:
            helios_run(compiled, prompts[:1], 4)
        best = {label: Best() for label in runs}
        tokens = {}
        for _ in range(args.repeats):
            for label, run in runs.items():
                wall, cpu, (count, tokens[label]) = timed(run)
                best[label].update(wall, cpu, count)
        theirs = best["transformers"]
        same = sum(all(tokens[label][row] == tokens["transformers"][row] for label in runs) for row in range(batch))
        line = (f"{name:9s} {batch:5d}  {1 / best['helios'].wall:12.1f}  {1 / theirs.wall:18.1f}"
                f"  {theirs.wall / best['helios'].wall:5.2f}  {theirs.cpu / best['helios'].cpu:9.2f}")
        if compiled is not None:
            ours = best["compiled"]
            line += f"  {1 / ours.wall:14.1f}  {theirs.wall / ours.wall:14.2f}  {theirs.cpu / ours.cpu:18.2f}"
        if bodies is not None:
            plain = best["bodies"]
            line += f"  {1 / plain.wall:12.1f}  {theirs.wall / plain.wall:12.2f}"
        print(f"{line}  {same:3d}/{batch}  {TARGETS.get(batch, '-'):>6s}", flush=True)


def checkpoints(args, scratch: Path) -> list[tuple[str, Path]]:
    if args.checkpoint is not None:
        return [(args.checkpoint.name[:9], args.checkpoint)]
    chosen = []
    for name in args.models.split(","):
        if name == "embedded":
            chosen.append((name, default_model_dir()))
        elif name == "llama4":
            chosen.append((name, write_random_llama(scratch / "llama4", with_layers(SMOKE, 4), torch.float32)))
        else:
            raise SystemExit(f"unknown model {name!r} (embedded, llama4)")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="embedded,llama4", help="comma-separated: embedded, llama4")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint directory instead of --models")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each, interleaved; best reported")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="both run in it")
    parser.add_argument("--glibc-thresholds", action="store_true",
                        help="build the engines without RuntimeOptions.hold_freed_memory (glibc malloc's moving "
                             "thresholds stay for the whole process, transformers' side included)")
    parser.add_argument("--compile-programs", action="store_true",
                        help="also run an engine whose CPU programs Inductor compiled at load")
    parser.add_argument("--bodies", action="store_true",
                        help="also run an engine without the C++ kernels (the ABI ops' Python bodies)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as scratch:
        chosen = checkpoints(args, Path(scratch))
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s), "
              f"{args.dtype}, {args.tokens} tokens per request, greedy, best of {args.repeats}")
        extra = "  compiled tok/s  compiled ratio  compiled cpu ratio" if args.compile_programs else ""
        extra += "  bodies tok/s  bodies ratio" if args.bodies else ""
        print(f"model     batch  helios tok/s  transformers tok/s  ratio  cpu ratio{extra}  same  target")
        for name, checkpoint in chosen:
            compare(name, checkpoint, Path(scratch), args, batches)


if __name__ == "__main__":
    main()

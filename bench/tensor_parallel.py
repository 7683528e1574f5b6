"""Tensor-parallel decode throughput: one rank (TP1) against two ranks (TP2), same weights, same prompts.

Writes a random Llama-3.1-8B-shaped checkpoint in bf16 (hidden 4096, MLP 14336, 32 heads, 8
key/value heads, head_dim 128, vocabulary 128256, rope theta 500000; --layers of them) with
`bench/random_llama.py`: tensor by tensor, drawn on the GPU when there is one, never whole and
never in float32 on the CPU, plus the tests' small tokenizer (prompts are token ids). Prepares it
for 1 and for 2 tensor-parallel ranks, loads each on --device (TP2: rank 0 on cuda:0, rank 1 on
cuda:1 as a local `helios rank` process; both with CUDA graphs) and times greedy (or, with
--temperature, seeded sampled) generation through
`helios.runtime.offline.generate` at each batch size: --prompt-tokens prompts of random token ids,
--output-tokens outputs each. Prints output tokens per second (decode only, and end to end with
the prompts' prefill) for TP1 and TP2 and their ratio, and whether TP1 and TP2 agree on the first
--compare-tokens tokens of every prompt.

Where the time goes: for the end-to-end run of every batch it prints each rank's phase timers
(`helios.runtime.parallel.rank_timing`: rank zero's message encode/send, program runs per operation and
completion agreement; a peer's receive (waiting included), decode, apply, program runs and
agreement) as seconds and share of the wall time; "engine" is rank zero's time outside its
executor (scheduling, admission, dispatch). TP1 reports its program runs alone.

    python bench/tensor_parallel.py                         # 2 GPUs, 32 layers (preparing takes minutes)
    python bench/tensor_parallel.py --layers 8 --workdir /tmp/tp-bench   # keeps checkpoint and cores
    python bench/tensor_parallel.py --workdir /tmp/tp-bench --prepare-only  # then again without it
    python bench/tensor_parallel.py --smoke                 # CPU, tiny shapes, gloo: checks the script

On CUDA the TP2 core runs twice by default: with NCCL all-reduces ("TP2") and with the one-shot
symmetric-memory all-reduce for small tensors ("TP2 symm", `RankOptions.symmetric_all_reduce`).
Each load line gives the load time, the all-reduce path the group took and the execution frames.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from random_llama import LLAMA_31_8B, SMOKE, with_layers, write_random_llama  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.parallel.rank_peers import RankOptions  # noqa: E402
from helios.runtime.parallel.rank_timing import PhaseTimers, run_phase  # noqa: E402
from helios.runtime.records.sampling_params import SamplingParams  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

NAMESPACE = "bench/tensor-parallel"


def say(line: str) -> None:
    print(line, flush=True)


PAGE_TOKENS = 16


def context_tokens(args) -> int:
    """Room for a prompt and its outputs, rounded up to whole pages, plus one page."""
    return -(-(args.prompt_tokens + args.output_tokens) // PAGE_TOKENS) * PAGE_TOKENS + PAGE_TOKENS


def capacity_plan(args) -> CapacityPlan:
    return CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=context_tokens(args),
                        prefill_tokens=args.prefill_tokens, decode_batches=tuple(sorted(set(args.batches))))


def prepared(workdir: Path, key: SigningKey, args, ranks: int) -> Path:
    """The core for `ranks` ranks (kept in --workdir and reused when its shape matches)."""
    core, stamp = workdir / f"tp{ranks}.core", workdir / f"tp{ranks}.core.json"
    recipe = json.dumps({"plan": repr(capacity_plan(args)), "shape": repr(args.shape), "seed": args.seed})
    if core.is_file() and stamp.is_file() and stamp.read_text() == recipe:
        say(f"reusing {core}")
        return core
    start = time.perf_counter()
    say(f"preparing the TP{ranks} core (captures the programs, shards and writes the weights)")
    options = PrepareOptions(NAMESPACE, capacities=capacity_plan(args), tensor_parallel=ranks)
    prepare_core(workdir / "checkpoint", core, key, options, progress=lambda line: say(f"  tp{ranks}: {line}"))
    stamp.write_text(recipe)
    say(f"prepared {core} ({core.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s")
    return core


def checkpoint(workdir: Path, args) -> Path:
    directory, stamp = workdir / "checkpoint", workdir / "checkpoint.json"
    recipe = json.dumps({"shape": repr(args.shape), "seed": args.seed})
    if stamp.is_file() and stamp.read_text() == recipe:
        say(f"reusing {directory}")
        return directory
    draw_on = "cuda" if args.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    say(f"writing a random {args.shape} checkpoint in bf16 to {directory} (drawn on {draw_on})")
    start = time.perf_counter()
    write_random_llama(directory, args.shape, torch.bfloat16, args.seed, progress=lambda line: say(f"  {line}"),
                       device=draw_on)
    stamp.write_text(recipe)
    say(f"checkpoint written in {time.perf_counter() - start:.0f} s")
    return directory


def signing_key(workdir: Path) -> SigningKey:
    path = workdir / "bench.key.pem"
    if path.is_file():
        return SigningKey.from_pem(path.read_bytes())
    key = SigningKey.generate()
    path.write_bytes(key.to_pem())
    return key


def prompts_for(batch: int, args, purpose: int) -> list[list[int]]:
    """Distinct random token-id prompts per (batch, purpose): runs never share a cached prefix."""
    draw = random.Random(args.seed * 1_000_003 + batch * 101 + purpose)
    return [[draw.randrange(args.shape.vocab_size) for _ in range(args.prompt_tokens)] for _ in range(batch)]


@dataclass(frozen=True)
class Measurement:
    decode_rate: float  # output tokens per second after the first token of every prompt
    total_rate: float  # output tokens per second, prefill included
    tokens: tuple[tuple[int, ...], ...]  # greedy tokens of the timed run
    total_s: float = 0.0  # wall time of the end-to-end run
    timers: tuple[PhaseTimers, ...] = ()  # every rank's phases during the end-to-end run


class TimedExecutor:
    """One rank's executor with rank zero's program timers (TP1's side of the breakdown)."""

    def __init__(self, executor):
        self._executor = executor
        self.timers = PhaseTimers()

    def __getattr__(self, name):
        return getattr(self._executor, name)

    @property
    def overlaps(self) -> bool:
        return self._executor.overlaps

    def launch(self, plan, *, alone: bool = False):
        if alone:  # run at finish, timed as one step (the peer side of TP1 has no messages)
            return plan, None
        with self.timers.phase("launch"):
            return plan, self._executor.launch(plan)

    def finish(self, handle):
        plan, launched = handle
        if launched is None:
            with self.timers.phase(run_phase(plan.operation)):
                return self._executor.run(plan)
        with self.timers.phase("finish"):
            return self._executor.finish(launched)

    def timings(self, reset: bool = False) -> list[PhaseTimers]:
        taken = PhaseTimers.from_tensor(self.timers.as_tensor())
        if reset:
            self.timers.reset()
        return [taken]


def timed(engine):
    """The engine's executor, able to report `timings` (a tensor-parallel one already is)."""
    if not hasattr(engine.executor, "timings"):
        engine.executor = TimedExecutor(engine.executor)
    return engine.executor


def measure(engine, batch: int, args) -> Measurement:
    """Warm-up, then the prompts' prefill alone (one output token), then the full timed run; every
    run on its own prompts so prefix caching never skips a prefill."""
    executor = timed(engine)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    generate(engine, prompts_for(batch, args, 0), 4, sampling=sampling)
    start = time.perf_counter()
    generate(engine, prompts_for(batch, args, 1), 1, sampling=sampling)
    prefill_s = time.perf_counter() - start
    executor.timings(reset=True)
    start = time.perf_counter()
    results = generate(engine, prompts_for(batch, args, 2), args.output_tokens, sampling=sampling)
    total_s = time.perf_counter() - start
    timers = tuple(executor.timings(reset=True))
    if any(r.finish_reason.name != "LENGTH" for r in results):
        raise SystemExit(f"generation failed: {[r.message for r in results if r.message]}")
    generated = sum(len(r.token_ids) for r in results)
    decode_s = max(total_s - prefill_s, 1e-9)
    return Measurement((generated - batch) / decode_s, generated / total_s, tuple(r.token_ids for r in results),
                       total_s, timers)


def breakdown(ranks: int, batch: int, measured: Measurement) -> None:
    """Each rank's phases of the end-to-end run: seconds, share of the wall time, count."""
    wall = measured.total_s
    say(f"  TP{ranks} B={batch} end to end {wall:.3f} s:")
    for rank, timers in enumerate(measured.timers):
        phases = timers.nonzero()
        parts = [f"{name} {seconds:.3f} s {100 * seconds / wall:.0f}% x{count}"
                 for name, (seconds, count) in phases.items()]
        if rank == 0:
            outside = wall - sum(seconds for seconds, _ in phases.values())
            parts.append(f"engine {outside:.3f} s {100 * outside / wall:.0f}%")
        say(f"    rank {rank}: " + ", ".join(parts))


def run_ranks(core: Path, key: SigningKey, ranks: int, args, symmetric: bool = False) -> dict[int, Measurement]:
    say(f"loading TP{ranks} on {args.device}" + (" (rank 1 as a local process)" if ranks > 1 else "")
        + (", symmetric all-reduce asked for" if symmetric else ""))
    start = time.perf_counter()
    ranked = RankOptions(collective_timeout_s=args.collective_timeout, symmetric_all_reduce=symmetric)
    options = RuntimeOptions(load=LoadOptions(device=args.device), ranks=ranked)
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
    path = getattr(runtime.engine.executor, "all_reduce_path", "none")
    say(f"loaded TP{ranks} in {time.perf_counter() - start:.1f} s (all-reduce: {path}, "
        f"{runtime.engine.frames} execution frame(s))")
    measured = {}
    try:
        for batch in args.batches:
            measured[batch] = measure(runtime.engine, batch, args)
            say(f"  TP{ranks} B={batch}: decode {measured[batch].decode_rate:.1f} tok/s, "
                f"end to end {measured[batch].total_rate:.1f} tok/s")
            breakdown(ranks, batch, measured[batch])
    finally:
        runtime.close()
        del runtime
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return measured


def agreement(one: Measurement, two: Measurement, compare: int) -> str:
    pairs = [(a[:compare], b[:compare]) for a, b in zip(one.tokens, two.tokens)]
    same = sum(a == b for a, b in pairs)
    prefixes = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in pairs]
    return f"{same}/{len(pairs)} prompts identical, shortest common prefix {min(prefixes)} tokens"


def report(results: dict[str, dict[int, Measurement]], args) -> None:
    """One row per workload: every run's tokens per second, then each TP2 run's ratio to TP1."""
    others = [name for name in results if name != "TP1"]
    say("")
    say(f"{'workload':<22}" + "".join(f"{name + ' tok/s':>16}" for name in results)
        + "".join(f"{name + '/TP1':>14}" for name in others))
    for label, rate in (("decode", lambda m: m.decode_rate), ("end to end", lambda m: m.total_rate)):
        for batch in args.batches:
            one = rate(results["TP1"][batch])
            say(f"{f'{label} B={batch}':<22}" + "".join(f"{rate(r[batch]):>16.1f}" for r in results.values())
                + "".join(f"{rate(results[name][batch]) / one:>14.2f}" for name in others))
    for name in others:
        say("")
        say(f"token agreement TP1 vs {name}, first {args.compare_tokens} tokens:")
        for batch in args.batches:
            say(f"  B={batch}: {agreement(results['TP1'][batch], results[name][batch], args.compare_tokens)}")
    say("  (random bf16 weights give nearly tied logits and TP2 sums its partial products in another order,")
    say("  so greedy paths may part after a few tokens, and sampled ones (a draw crosses a bf16 rounding of the")
    say("  distribution) at once; tests/parallel/test_cuda.py checks exact float32 agreement)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--layers", type=int, help="decoder layers (default 32; --smoke: 2)")
    parser.add_argument("--batches", help="comma-separated batch sizes (default 1,64; --smoke: 1,4)")
    parser.add_argument("--prompt-tokens", type=int, help="prompt length in token ids (default 128; --smoke: 16)")
    parser.add_argument("--output-tokens", type=int, help="greedy output tokens per prompt (default 128; --smoke: 16)")
    parser.add_argument("--compare-tokens", type=int, default=32, help="tokens compared between TP1 and TP2")
    parser.add_argument("--prefill-tokens", type=int,
                        help="packed prefill tokens per step (default and most: the context, prompt + output + 16)")
    parser.add_argument("--device", help="serving device of rank 0 (default cuda; --smoke: cpu)")
    parser.add_argument("--workdir", type=Path, help="keep checkpoint and cores here and reuse them (default: temp)")
    parser.add_argument("--seed", type=int, default=0, help="weights, prompts and sampling seed")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature of every request (default 0: greedy; above 0 every step draws, "
                             "so tensor-parallel ranks gather their logit rows instead of exchanging winners)")
    parser.add_argument("--collective-timeout", type=float, default=300.0, help="seconds (a lost rank fails after)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads of this process (CPU runs)")
    parser.add_argument("--all-reduce", choices=("nccl", "symmetric", "both"),
                        help="TP2 runs: NCCL all-reduces, the one-shot symmetric-memory path for small ones "
                             "(falls back to NCCL where unavailable; the load line says which), or both "
                             "(default on CUDA; on the CPU: nccl, which is gloo there)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (gloo): checks the script")
    parser.add_argument("--prepare-only", action="store_true",
                        help="stop once the checkpoint and both cores exist (with --workdir: measure in a later run)")
    args = parser.parse_args(argv)
    smoke = args.smoke
    shape = SMOKE if smoke else LLAMA_31_8B
    args.shape = with_layers(shape, args.layers) if args.layers else shape
    args.batches = [int(b) for b in (args.batches or ("1,4" if smoke else "1,64")).split(",")]
    args.prompt_tokens = args.prompt_tokens or (16 if smoke else 128)
    args.output_tokens = args.output_tokens or (16 if smoke else 128)
    args.prefill_tokens = min(args.prefill_tokens or context_tokens(args), context_tokens(args))
    args.device = args.device or ("cpu" if smoke else "cuda")
    args.all_reduce = args.all_reduce or ("both" if args.device.startswith("cuda") else "nccl")
    if args.shape.num_hidden_layers < 1 or min(args.batches) < 1 or min(args.prompt_tokens, args.output_tokens) < 1:
        parser.error("--layers, --batches, --prompt-tokens and --output-tokens must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    say(f"torch {torch.__version__}, device {args.device}, {args.shape}, batches {args.batches}, "
        f"{args.prompt_tokens}-token prompts, {args.output_tokens} output tokens, "
        + (f"temperature {args.temperature}, seed {args.seed}" if args.temperature > 0 else "greedy"))
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="helios-tp-bench-")))
        workdir.mkdir(parents=True, exist_ok=True)
        key = signing_key(workdir)
        checkpoint(workdir, args)
        cores = {ranks: prepared(workdir, key, args, ranks) for ranks in (1, 2)}
        if args.prepare_only:
            return
        results = {"TP1": run_ranks(cores[1], key, 1, args)}
        if args.all_reduce in ("nccl", "both"):
            results["TP2"] = run_ranks(cores[2], key, 2, args)
        if args.all_reduce in ("symmetric", "both"):
            results["TP2 symm"] = run_ranks(cores[2], key, 2, args, symmetric=True)
    report(results, args)


if __name__ == "__main__":
    main()

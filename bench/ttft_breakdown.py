"""Where time to first token goes: a 2,048-token prompt cold and with 90% of it cached, split into
host work and program time, the programs' device time per prefill capacity, the prefill step's
kernels by kind (matmul, attention, fused ops, sampling), and the prefill attention kernel alone.

Prepares an 8B-shaped core (``--layers``) whose prefill capacities are 2,048 tokens with the chunk
capacities ``--chunks`` (the rest of a cached prompt runs in the smallest capacity that holds it, so a
208-token rest pays for 512 tokens when 512 is the next capacity), loads it, then:

- TTFT: ``--repeats`` distinct prompts each, cold and 90% cached; per request the wall time, the
  program time (each program call synchronised and timed), and host = wall - program; the medians;
- the program time of a cold prompt that exactly fills each prefill capacity;
- the torch profiler's kernels of one eager 2,048-token prefill step by kind and the top kernels;
- cProfile of one cold request's host side (functions by own time; the program calls are in it).

    python bench/ttft_breakdown.py [--layers 32] [--chunks 128,256,512,1024] [--json out.json]
    python bench/ttft_breakdown.py --core DIR  # the 2,048-capacity core bench/cold_start.py --keep-core DIR kept
    python bench/ttft_breakdown.py --smoke    # tiny model on the CPU (checks the script runs)
    python bench/ttft_breakdown.py --smoke --vocab 128256 --prompt 2048 --repeats 5  # host time on the CPU
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lever_ab  # noqa: E402
from gpu_serving import NAMESPACE, log, time_to_first_token  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers, write_random_llama  # noqa: E402

from helios.contract import StartupOptions  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions, program_arguments  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402


class ProgramClock:
    """Wraps every loaded program's module: each call is synchronised and its wall time summed."""

    def __init__(self, programs, device: torch.device):
        self.seconds, self.device = 0.0, device
        for program in programs:
            object.__setattr__(program, "module", self._timed(program.module))

    def _timed(self, module):
        call = self._clocked(module)
        if hasattr(module, "replay"):  # a captured program: the CUDA executor calls replay(greedy=...)
            call.replay = self._clocked(module.replay)
        if hasattr(module, "_module"):  # what lever_ab reaches through
            call._module = module._module
        return call

    def _clocked(self, function):
        def call(*args, **kwargs):
            self._sync()
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._sync()
                self.seconds += time.perf_counter() - start
        return call

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def prompt(length: int, vocab: int, salt: int) -> list[int]:
    return [(i * 131 + 7 + salt * 7919) % (vocab - 16) + 16 for i in range(length)]


def ttft(engine, clock: ProgramClock, vocab: int, length: int, repeats: int) -> dict:
    """Median wall, program and host ms of cold and 90%-cached requests (distinct prompts each)."""
    rows = {"cold": [], "cached": []}
    shared = int(length * 0.9)
    for repeat in range(repeats):
        base = prompt(length, vocab, 1000 + repeat)
        for kind, tokens in (("cold", base), ("cached", base[:shared] + prompt(length - shared, vocab, 5000 + repeat))):
            clock.seconds = 0.0
            wall, reused = time_to_first_token(engine, tokens)
            rows[kind].append((wall, clock.seconds, reused))
    summary = {}
    for kind, samples in rows.items():
        wall = statistics.median(s[0] for s in samples)
        program = statistics.median(s[1] for s in samples)
        summary[kind] = {"wall_ms": wall * 1e3, "program_ms": program * 1e3, "host_ms": (wall - program) * 1e3,
                         "reused_tokens": samples[-1][2]}
        log(f"TTFT {length} tokens {kind:<6} (reused {samples[-1][2]:4d}): {wall * 1e3:7.2f} ms = program "
            f"{program * 1e3:7.2f} ms + host {(wall - program) * 1e3:6.2f} ms (median of {len(samples)})")
    return summary


def capacity_rows(engine, clock: ProgramClock, vocab: int, capacities: list[int]) -> list[dict]:
    """Program ms of a cold prompt that exactly fills each prefill capacity (the captured graph's
    replay on CUDA, synchronised), median of three distinct prompts."""
    rows = []
    for tokens in capacities:
        times = []
        for repeat in range(3):
            clock.seconds = 0.0
            time_to_first_token(engine, prompt(tokens, vocab, 20000 + 10 * tokens + repeat))
            times.append(clock.seconds)
        ms = statistics.median(times) * 1e3
        rows.append({"tokens": tokens, "program_ms": ms})
        log(f"prefill capacity T={tokens}: {ms:.2f} ms of program time for a {tokens}-token cold prompt")
    return rows


def prefill_profile(model, tokens: int, top: int) -> dict:
    """Kernels of one eager prefill call at `tokens` by kind (lever_ab's categories), top kernels."""
    program = next((p for p in model.programs if p.graph == "prefill" and p.packed_token_capacity == tokens), None)
    if program is None:
        return {}
    arguments = program_arguments(program, model.weights, model.buffers)
    module = lever_ab._eager(program)
    on_cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    module(*arguments)
    lever_ab._synchronize()
    with torch.profiler.profile(activities=activities) as profile:
        module(*arguments)
        lever_ab._synchronize()
    kernels = lever_ab._kernels(profile, on_cuda)
    kinds = lever_ab._categories(kernels, on_cuda)
    log(f"prefill T={tokens} eager kernels by kind: " + ", ".join(f"{k} {ms:.2f} ms" for k, ms in kinds.items()))
    ranked = lever_ab._top_kernels(kernels, top)
    for entry in ranked:
        log(f"  {entry['ms']:8.3f} ms  x{entry['calls']:<4d} {entry['kernel']}")
    return {"tokens": tokens, "by_kind_ms": kinds, "top": ranked}


def host_profile(engine, vocab: int, length: int, rows: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    time_to_first_token(engine, prompt(length, vocab, 9999))
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    log("--- one cold request, functions by own time (program calls included)")
    log("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


def request_profile(engine, vocab: int, length: int, rows: int) -> dict:
    """One 90%-cached request under the torch profiler (CPU ops and CUDA kernels): the host ops by
    own CPU time, and the request's wall time against the kernels' summed device time, which shows
    how long the device sat idle while the host worked."""
    base = prompt(length, vocab, 7777)
    time_to_first_token(engine, base)  # the shared prefix, cached
    cached = base[: int(length * 0.9)] + prompt(length - int(length * 0.9), vocab, 8888)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        wall, _ = time_to_first_token(engine, cached)
    on_cuda = torch.cuda.is_available()
    device_ms = sum(lever_ab._self_us(e, on_cuda) for e in lever_ab._kernels(profile, on_cuda)) / 1e3
    log(f"--- one cached request under the profiler: wall {wall * 1e3:.2f} ms, kernels {device_ms:.2f} ms")
    table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    log(table)
    return {"wall_ms": wall * 1e3, "kernel_ms": device_ms}


def prepared_core(scratch: Path, shape, length: int, chunks: tuple[int, ...], device: torch.device):
    """A fresh core of `shape` whose prefill capacities are `chunks` and `length`, opened."""
    key = SigningKey.generate()
    checkpoint = write_random_llama(scratch / "checkpoint", shape, torch.bfloat16, device=device.type)
    plan = CapacityPlan(page_tokens=16, context_tokens=length + 64, prefill_tokens=length, decode_batches=(1,),
                        prefill_batches=(1,), mixed=False, page_capacity=8 * -(-(length + 64) // 16),
                        prefill_chunks=chunks, token_logprobs=False)
    started = time.perf_counter()
    prepare_core(checkpoint, scratch / "ttft.core", key, PrepareOptions(NAMESPACE, capacities=plan))
    log(f"prepared in {time.perf_counter() - started:.0f} s (prefill capacities {[*chunks, length]})")
    return open_core(scratch / "ttft.core", accept=NAMESPACE, trusted_keys=[key.public])


def reused_core(folder: Path):
    """The core `bench/cold_start.py --keep-core` left in `folder` (model.core, publisher.key.pub)."""
    return open_core(folder / "model.core", accept=NAMESPACE, trusted_keys=[folder / "publisher.key.pub"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 2048; smoke 64)")
    parser.add_argument("--chunks", default="128,256,512,1024")
    parser.add_argument("--repeats", type=int, default=None, help="requests per TTFT kind (default 5; smoke 1)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary size of the prepared model (e.g. --smoke --vocab 128256 --prompt 2048: "
                             "the 8B model's histogram and prompt on the tiny model, for host time on the CPU)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--core", type=Path, default=None,
                        help="load the core bench/cold_start.py --keep-core left here instead of preparing one")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    if args.vocab:
        shape = dataclasses.replace(shape, vocab_size=args.vocab)
    length = args.prompt or (64 if args.smoke else 2048)
    chunks = tuple(c for c in (int(x) for x in args.chunks.split(",")) if 0 < c < length)
    results = {"layers": shape.num_hidden_layers, "prompt": length, "chunks": list(chunks)}
    with tempfile.TemporaryDirectory() as scratch:
        opened = reused_core(args.core) if args.core else prepared_core(Path(scratch), shape, length, chunks, device)
        started = time.perf_counter()
        startup = StartupOptions(token_logprobs=False) if args.core else StartupOptions()  # TTFT needs no logprobs
        runtime = build_runtime(opened, RuntimeOptions(load=LoadOptions(startup, device=str(device),
                                                                        cuda_graphs=device.type == "cuda")))
        log(f"loaded in {time.perf_counter() - started:.1f} s")
        if args.core:  # the kept core's own prefill capacities
            chunks = tuple(sorted({p.packed_token_capacity for p in runtime.model.programs
                                   if p.graph == "prefill" and p.packed_token_capacity < length}))
            results.update(layers=None, chunks=list(chunks), core=str(args.core))  # cold_start's --layers
            log(f"reusing {args.core}: prefill capacities {[*chunks, length]}")
        try:
            clock = ProgramClock(runtime.model.programs, device)
            time_to_first_token(runtime.engine, prompt(length, shape.vocab_size, 1))  # warm-up
            results["ttft"] = ttft(runtime.engine, clock, shape.vocab_size, length, args.repeats or (1 if args.smoke else 5))
            results["capacities"] = capacity_rows(runtime.engine, clock, shape.vocab_size, [*chunks, length])
            # the last request filled the full capacity: the program's buffers hold a real step
            results["prefill_profile"] = prefill_profile(runtime.model, length, args.top)
            host_profile(runtime.engine, shape.vocab_size, length, args.top + 8)
            results["cached_request_profile"] = request_profile(runtime.engine, shape.vocab_size, length, args.top + 18)
        finally:
            runtime.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

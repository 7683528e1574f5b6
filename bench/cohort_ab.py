"""Same-process A/B of the steady decode cohort's host path and the compiled segments' calls (not a
test).

"current": the steady decode step composed directly (`helios.runtime.scheduling.steady`), plain
decode completions checked in one pass (`helios.runtime.execution.decode_results`) and, with
--compile-programs, compiled segments that call Inductor's generated code directly
(`helios.runtime.loading.segment_calls`). "previous": the general composition, lane-by-lane
validation and, compiled, segments called through AOT Autograd's wrappers (a second engine loaded
from the same core with the direct calls refused). Both sides generate the same greedy workload,
alternated --repeats times (the order swapped every round); printed: thread CPU time and wall time
per step (prefill included, as `bench/cpu_step_profile.py` counts it), the host share (the step
without the program call), best and median of each side, their ratios, and whether the tokens
of both sides are the same.

    .venv/bin/python bench/cohort_ab.py [--model embedded|llama4] [--batch 16] [--tokens 64]
        [--repeats 7] [--compile-programs]
"""

from __future__ import annotations

import argparse
import statistics
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
from helios.runtime.loading import segment_calls  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

NAMESPACE = "bench/cohort"


def _core(model: str, batch: int, tokens: int, scratch: Path):
    checkpoint = default_model_dir() if model == "embedded" else write_random_llama(
        scratch / "llama4", with_layers(SMOKE, 4), torch.float32)
    key = SigningKey.generate()
    plan = CapacityPlan(context_tokens=8 + tokens + 8, prefill_tokens=64, decode_batches=tuple(sorted({1, batch})))
    prepare_core(checkpoint, scratch / "bench.core", key, PrepareOptions(NAMESPACE, capacities=plan, dtype="float32"))
    return lambda: open_core(scratch / "bench.core", accept=NAMESPACE, trusted_keys=[key.public])


def _engines(opened, compiled: bool):
    """(current engine, previous engine): two loads when compiled (the previous one's segments
    called through AOT's wrappers), else one engine whose host levers are switched per run."""
    options = RuntimeOptions(load=LoadOptions(compile_programs=compiled))
    current = build_runtime(opened(), options).engine
    if not compiled:
        return current, current
    direct = segment_calls._direct_call
    segment_calls._direct_call = lambda *args: None
    try:
        previous = build_runtime(opened(), options).engine
    finally:
        segment_calls._direct_call = direct
    return current, previous


def _side(engine, current: bool):
    engine.scheduler.builder.steady = current
    engine.executor.array_results = current
    return engine


def _run(engine, prompts, tokens: int) -> tuple[float, float, float, list]:
    """(thread CPU, wall, program thread CPU) seconds per step, and the tokens."""
    spent = [0.0]
    executor = engine.executor
    inner = executor._call

    def timed(program, plan):
        started = time.thread_time()
        try:
            return inner(program, plan)
        finally:
            spent[0] += time.thread_time() - started
    executor._call = timed
    try:
        cpu, wall = time.thread_time(), time.perf_counter()
        results = generate(engine, prompts, tokens)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    finally:
        del executor._call
    steps = tokens + 1
    return cpu / steps, wall / steps, spent[0] / steps, [list(r.token_ids) for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", choices=("embedded", "llama4"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile-programs", action="store_true", help="compile the programs with Inductor at load")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        current, previous = _engines(_core(args.model, args.batch, args.tokens, Path(scratch)), args.compile_programs)
        prompts = [[(b * 13 + i) % 500 + 3 for i in range(8)] for b in range(args.batch)]
        sides = {"previous": lambda: _side(previous, False), "current": lambda: _side(current, True)}
        samples: dict[str, list[tuple]] = {name: [] for name in sides}
        tokens = {}
        for name, engine in sides.items():  # warm-up (the programs' checked first calls), and the tokens
            tokens[name] = _run(engine(), prompts, args.tokens)[3]
        for index in range(args.repeats):
            for name in (sides if index % 2 == 0 else reversed(list(sides))):
                samples[name].append(_run(sides[name](), prompts, args.tokens)[:3])
        _side(current, True)
        print(f"{args.model}, batch {args.batch}, {args.tokens} tokens, compiled {args.compile_programs}: per step, "
              f"{args.repeats} alternated runs each; same tokens: {tokens['current'] == tokens['previous']}")
        _report(samples)


def _report(samples: dict[str, list[tuple]]) -> None:
    columns = {"thread CPU": lambda s: s[0], "wall": lambda s: s[1], "host CPU": lambda s: s[0] - s[2]}
    for label, value in columns.items():
        line = []
        for name, runs in samples.items():
            values = [value(s) for s in runs]
            line.append(f"{name} best {1e6 * min(values):6.0f} median {1e6 * statistics.median(values):6.0f}")
        current = [value(s) for s in samples["current"]]
        previous = [value(s) for s in samples["previous"]]
        print(f"  {label:10s} us: " + " | ".join(line) + f" | current/previous best {min(current) / min(previous):.3f}"
              f" median {statistics.median(current) / statistics.median(previous):.3f}")


if __name__ == "__main__":
    main()

"""Same-process A/B of a steady decode cohort's host work per step, at 16 and 256 rows (not a test).

Prepares one core (the 4-layer random Llama of `bench/generate_vs_hf.py`, or --layers of it) with
DECODE programs at every --batches size, loads it once (eager programs: the host path does not
depend on them) and generates --tokens greedy tokens for each batch of 8-token prompts, alternately
with the previous host bodies and the current ones (`PREVIOUS` / `CURRENT` below; the order swapped
every round). Only the steady decode steps of the whole batch count (not the prefill, not the
steps where rows leave): for each, the thread CPU time of the engine step, the program call, and the
host phases around it - scheduling (`Scheduler.schedule`), the launch without the program call
(packing), the completion's validation (`Executor.finish`), the scheduler's completion
(`Scheduler.complete`) and the rest (events, their delivery, gauges) - and the garbage collector's
time inside the step (`gc`: a share of the phases it interrupts, timed by `gc.callbacks`); "results"
is the validation of the completion record (`Executor._results`, inside "finish").

Prints, per batch and side: medians (and bests) over the rounds of the per-step medians, in us,
host = step - program; the ratios current / previous; whether both sides' tokens are equal.

    .venv/bin/python bench/cohort_host_ab.py [--batches 16,256] [--tokens 56] [--repeats 7] [--layers 4]
        [--device cpu|cuda] [--frames 1|2]

With --device cuda the core loads onto the GPU with its programs captured into CUDA graphs and the
engine keeps two plans in flight (a decode cohort then mostly runs as second frames, which the
general composition builds): "program" is the graph launch, "finish" includes the wait for the
device, and "results" is the completion's validation alone (inside "finish"). --frames 2 on the CPU
runs those second frames too (each launch completes at once there).
"""

from __future__ import annotations

import argparse
import collections
import gc
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
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.records.capacities import Operation  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402
import cohort_previous  # noqa: E402

NAMESPACE = "bench/cohort-host"
PHASES = ("schedule", "pack", "program", "finish", "results", "complete")


def _engine(batches: list[int], tokens: int, layers: int, scratch: Path, device: str = "cpu"):
    checkpoint = write_random_llama(scratch / "llama", with_layers(SMOKE, layers), torch.float32)
    key = SigningKey.generate()
    plan = CapacityPlan(context_tokens=max(8 + tokens + 8, 64), prefill_tokens=64,
                        decode_batches=tuple(sorted({1, *batches})))
    prepare_core(checkpoint, scratch / "bench.core", key, PrepareOptions(NAMESPACE, capacities=plan, dtype="float32"))
    opened = open_core(scratch / "bench.core", accept=NAMESPACE, trusted_keys=[key.public])
    load = LoadOptions(device=device, cuda_graphs=device == "cuda")
    return build_runtime(opened, RuntimeOptions(load=load, queue_capacity=max(batches) + 8)).engine


class StepTimer:
    """Thread CPU time of each engine step and of its phases; keeps the full-cohort decode steps."""

    def __init__(self, engine):
        self.engine = engine
        self.current: dict = collections.defaultdict(float)
        self.steps: list[dict] = []
        self.batch = 0
        scheduler, executor = engine.scheduler, engine.executor
        self._wrap(scheduler, "schedule", "schedule")
        self._wrap(executor, "launch", "pack")
        self._wrap(executor, "_call", "program")
        self._wrap(executor, "finish", "finish")
        self._wrap(executor, "_results", "results")
        self._wrap(scheduler, "complete", "complete")
        self._wrap(engine, "step", "step")
        self._collecting = 0.0
        gc.callbacks.append(self._collection)

    def _collection(self, phase: str, info: dict) -> None:
        """The garbage collector's own time, by its start and stop callbacks."""
        if phase == "start":
            self._collecting = time.thread_time()
        else:
            self.current["gc"] += time.thread_time() - self._collecting

    def _wrap(self, owner, name: str, key: str) -> None:
        inner = getattr(owner, name)
        timer = self

        def timed(*args, **kwargs):
            if key == "step":
                timer.current = collections.defaultdict(float)
            started = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                timer.current[key] += time.thread_time() - started
                if key == "pack":
                    plan = args[0]
                    timer.current["full"] = plan.operation is Operation.DECODE and len(plan.rows) == timer.batch
                if key == "step" and timer.current.get("full"):
                    timer.steps.append(dict(timer.current))
        setattr(owner, name, timed)

    def run(self, prompts, tokens: int) -> tuple[dict, list]:
        """Median per-step times of the full-cohort decode steps, and the tokens."""
        self.steps, self.batch = [], len(prompts)
        results = generate(self.engine, prompts, tokens)
        split = {}
        for key in ("step", "gc", *PHASES):
            split[key] = statistics.median(step.get(key, 0.0) for step in self.steps)
        split["pack"] = statistics.median(s["pack"] - s["program"] for s in self.steps)
        split["host"] = statistics.median(s["step"] - s["program"] for s in self.steps)
        split["other"] = statistics.median(s["step"] - sum(s.get(k, 0.0) for k in ("schedule", "pack", "finish",
                                                                                    "complete")) for s in self.steps)
        return split, [list(r.token_ids) for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,256")
    parser.add_argument("--tokens", type=int, default=56)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: the programs captured into CUDA graphs, two execution frames")
    parser.add_argument("--frames", type=int, choices=(1, 2),
                        help="execution frames (default: the engine's choice, 1 on the CPU, 2 on CUDA)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        engine = _engine(batches, args.tokens, args.layers, Path(scratch), args.device)
        engine.frames = args.frames or engine.frames
        timer = StepTimer(engine)
        sides = {"previous": cohort_previous.PREVIOUS, "current": cohort_previous.CURRENT}
        for batch in batches:
            prompts = [[(b * 13 + i) % 500 + 3 for i in range(8)] for b in range(batch)]
            samples: dict[str, list[dict]] = {name: [] for name in sides}
            tokens = {}
            for name, bodies in sides.items():  # warm-up, and the tokens
                cohort_previous.use(engine, bodies)
                tokens[name] = timer.run(prompts, args.tokens)[1]
            for index in range(args.repeats):
                for name in (sides if index % 2 == 0 else reversed(list(sides))):
                    cohort_previous.use(engine, sides[name])
                    samples[name].append(timer.run(prompts, args.tokens)[0])
            cohort_previous.use(engine, cohort_previous.CURRENT)
            print(f"batch {batch}, {args.layers}-layer Llama on {args.device}, {engine.frames} frame(s), "
                  f"{args.tokens} tokens, {len(timer.steps)} full decode steps "
                  f"a run, {args.repeats} alternated runs each; same tokens: {tokens['current'] == tokens['previous']}")
            _report(samples)


def _report(samples: dict[str, list[dict]]) -> None:
    for key in ("step", "host", "program", *[p for p in PHASES if p != "program"], "other", "gc"):
        line = []
        for name, runs in samples.items():
            values = [run[key] for run in runs]
            line.append(f"{name} {1e6 * statistics.median(values):7.1f} (best {1e6 * min(values):7.1f})")
        ratio = (statistics.median(r[key] for r in samples["current"])
                 / max(statistics.median(r[key] for r in samples["previous"]), 1e-9))
        print(f"  {key:9s} us median: " + " | ".join(line) + f" | current/previous {ratio:.3f}")


if __name__ == "__main__":
    main()

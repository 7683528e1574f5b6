"""The Triton precompile's makespan under two dispatch orders, replayed from one load's report.

A load's `KernelCompiler.wait` reports every variant it compiled: the kernel, when the dry run sent it
(seconds after the first), how long its worker took, and when it was done. `simulate` replays those
sends and compile times on `workers` workers: in the order sent (`bench/cold_start.py --compile-order
sent`), or with a freed worker taking the waiting variant expected to compile longest (a load's default,
`LoadOptions.compile_longest_first`, `kernel_precompile.expected_seconds`); set against the recorded finish
of a load made that way, a replay checks the model.
The compile times are the ones measured under the recorded order's contention, so the replay is a model
of the other order, not a measurement of it.

    python bench/compile_dispatch.py COLD_START_JSON [...]     # bench/cold_start.py --json writes it
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

from helios.runtime.loading.kernel_precompile import CompileJob, expected_seconds


def simulate(compiles: list, workers: int, longest_first: bool) -> float:
    """When the last variant is done (seconds after the first was sent), for `compiles` as a load's
    report lists them: (kernel, label, sent, took, finished)."""
    jobs = sorted((sent, took, kernel) for kernel, _, sent, took, _ in compiles)
    free = [0.0] * max(workers, 1)  # when each worker is next free (a heap)
    waiting: list = []  # (priority, sent, took)
    index, finish = 0, 0.0
    while index < len(jobs) or waiting:
        now = free[0]
        if not waiting and index < len(jobs):
            now = max(now, jobs[index][0])  # the next worker's time, or the next send if nothing waits
        while index < len(jobs) and jobs[index][0] <= now:
            sent, took, kernel = jobs[index]
            module, _, name = kernel.rpartition(".")
            priority = -expected_seconds(CompileJob(module, name, {}, {}, {}, {}, None)) if longest_first else 0.0
            heapq.heappush(waiting, (priority, sent, took))
            index += 1
        _, sent, took = heapq.heappop(waiting)
        start = max(heapq.heappop(free), sent)
        heapq.heappush(free, start + took)
        finish = max(finish, start + took)
    return finish


def describe(compiles: list, workers: int) -> str:
    recorded = max((finished for *_, finished in compiles), default=0.0)
    return (f"{len(compiles)} variants on {workers} workers: the last done {recorded:.1f} s after the first sent; "
            f"replayed in the order sent {simulate(compiles, workers, False):.1f} s, longest first "
            f"{simulate(compiles, workers, True):.1f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, nargs="+", help="bench/cold_start.py --json output")
    args = parser.parse_args(argv)
    for path in args.json:
        for variant, stages in json.loads(path.read_text()).get("variants", {}).items():
            for stage, numbers in stages.items():
                precompile = numbers.get("precompile") if isinstance(numbers, dict) else None
                if precompile and precompile["compiles"]:
                    print(f"{path} {variant} {stage}: {describe(precompile['compiles'], precompile['workers'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

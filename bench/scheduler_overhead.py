"""Host scheduling cost per step: `schedule()` + `complete()` at 1, 64 and 256 active lanes.

Not a test. Builds a scheduler with a paged cache large enough for every lane, prefills the
lanes, then times steady decode steps. The executor is replaced by precomputed completion
records built outside the timed region, so the numbers are the scheduler's own host time
(plan building, page growth, digest publication every `page_tokens` steps, validation, token
events). With `--two-frames` the steady state keeps two decode rounds in flight.

    .venv/bin/python bench/scheduler_overhead.py [--steps 400] [--lanes 1 64 256] [--step-ms 8.7]

`--step-ms` prints each median as a share of a program step of that duration (for example a
measured decode replay), the ratio the issue asks for once a real program runs beside it.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from helios.runtime.records.capacities import CacheGeometry, Capacities, Operation, ProgramVariant, StorageLayout
from helios.runtime.records.plan import RowResult, StepPlan
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.scheduler import Scheduler

PAGE_TOKENS = 16
PROMPT_TOKENS = 64


def build(lanes: int, two_frames: bool, steps: int) -> Scheduler:
    batches = sorted({1, 8, 64, 256, lanes})
    variants = [ProgramVariant(f"decode{b}", Operation.DECODE, b, b) for b in batches if b <= lanes]
    variants.append(ProgramVariant("prefill", Operation.PREFILL, lanes, max(lanes * PROMPT_TOKENS, 2048)))
    variants.append(ProgramVariant("mixed", Operation.MIXED, lanes, max(lanes * PROMPT_TOKENS, 2048)))
    context = PROMPT_TOKENS + steps * 3 + 8
    pages_per_lane = -(-context // PAGE_TOKENS)
    geometry = CacheGeometry(StorageLayout(PAGE_TOKENS), lanes * pages_per_lane + 8, pages_per_lane, 8, 0, b"bench")
    caps = Capacities(lanes, context, max(lanes * PROMPT_TOKENS, 2048), 32000, tuple(variants), geometry,
                      queue_capacity=lanes)
    scheduler = Scheduler.create(caps, SchedulerPolicy(two_frames=two_frames))
    for lane in range(lanes):
        prompt = tuple((lane * 7919 + i * 31) % 32000 for i in range(PROMPT_TOKENS))
        scheduler.submit(RequestSpec(f"r{lane}", prompt, context - PROMPT_TOKENS, frozenset({0})))
    return scheduler


def results_for(plan: StepPlan, sequence: int) -> list[RowResult]:
    token = 1 + sequence % 31000
    return [RowResult(row.slot, row.generation, row.start_pos + row.query_len, (token + row.slot,))
            for row in plan.rows]


def measure(lanes: int, two_frames: bool, steps: int) -> list[float]:
    """Seconds of host time per full decode round: its schedule() and complete() calls plus any
    schedule() calls that returned None while it was the oldest round in flight."""
    scheduler = build(lanes, two_frames, steps)
    inflight: list[tuple[StepPlan, list[RowResult]]] = []
    costs: dict[int, float] = {}
    samples: list[float] = []
    idle = 0.0
    gc.collect()
    while len(samples) < steps:
        started = time.perf_counter()
        plan = scheduler.schedule()
        elapsed = time.perf_counter() - started
        if plan is not None:
            costs[plan.sequence] = elapsed
            inflight.append((plan, results_for(plan, plan.sequence)))
            continue
        idle += elapsed
        done, results = inflight.pop(0)
        started = time.perf_counter()
        scheduler.complete(done, results)
        cost = costs.pop(done.sequence) + idle + time.perf_counter() - started
        idle = 0.0
        if done.operation == Operation.DECODE and len(done.rows) == lanes:
            samples.append(cost)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-ms", type=float, default=None, help="program step time to compare against")
    args = parser.parse_args()
    print(f"page_tokens={PAGE_TOKENS} prompt={PROMPT_TOKENS} steps={args.steps}")
    header = f"{'lanes':>6} {'frames':>6} {'median us':>10} {'p90 us':>8} {'p99 us':>8} {'us/lane':>8}"
    print(header + ("  share of step" if args.step_ms else ""))
    for lanes in args.lanes:
        for two_frames in (False, True):
            samples = sorted(measure(lanes, two_frames, args.steps))
            median = statistics.median(samples) * 1e6
            p90 = samples[int(0.9 * (len(samples) - 1))] * 1e6
            p99 = samples[int(0.99 * (len(samples) - 1))] * 1e6
            frames = 2 if two_frames else 1
            line = f"{lanes:>6} {frames:>6} {median:>10.1f} {p90:>8.1f} {p99:>8.1f} {median / lanes:>8.2f}"
            if args.step_ms:
                line += f"  {median / (args.step_ms * 1e3):.1%}"
            print(line)


if __name__ == "__main__":
    main()

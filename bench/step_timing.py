"""Where a served step's time goes (used by `bench/decode_host_ab.py`; importable on its own).

`StepTiming` wraps a running engine's methods (benchmark instrumentation, not runtime code):

- each program launch of the executor gets CUDA events recorded just before and just after its
  graph replay, so once the run is over each step's device ms (start to end) and the device's idle
  ms before it (the previous step's end to this start: the host was late) are known;
- each engine step's wall time is split into the wait for the device (the completion event) and
  the host's own work, and that into phases: schedule, launch (packing, uploads, replay), finish
  (the record's validation), complete (the scheduler), dispatch (events to the requests), flush.

`legacy_greedy_graphs` captures, beside a loaded model's greedy graphs, the greedy graphs as they
were before `helios.runtime.loading.sampling_rewrite` (the GREEDY variant bound, nothing rewritten),
and swaps either set in (same-process A/B of the rewrite).
"""

from __future__ import annotations

import statistics
import time

import torch

from helios.abi.sampling import SampleVariant
from helios.runtime.loading import cuda_graphs
from helios.runtime.loading.constants import write_constants
from helios.runtime.loading.model import program_arguments, tuned_outputs

PHASES = ("schedule", "launch", "finish", "complete", "dispatch", "flush")


class Wrappers:
    """Methods replaced on instances, each put back by `restore` (the instance's own attribute again,
    or none: its class's method)."""

    def __init__(self):
        self._saved: list = []

    def set(self, owner, name: str, wrapper) -> None:
        self._saved.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, wrapper)

    def restore(self) -> None:
        for owner, name, before in reversed(self._saved):
            if before is None:
                delattr(owner, name)
            else:
                setattr(owner, name, before)
        self._saved = []


class StepTiming:
    def __init__(self, engine):
        self.engine = engine
        self.cuda = engine.executor.model.device.type == "cuda"
        self.reset()
        self._wrappers = Wrappers()  # `close` restores them
        executor, scheduler = engine.executor, engine.scheduler
        self._wrap(scheduler, "schedule", "schedule")
        self._wrap(executor, "launch", "launch")
        self._wrap(scheduler, "complete", "complete")
        self._wrap(engine, "_dispatch", "dispatch")
        self._wrap(engine.outbox, "flush", "flush")
        call, finish, step = executor._call, executor.finish, engine.step

        def timed_call(program, plan):
            if not self.cuda:
                return call(program, plan)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            returned = call(program, plan)
            end.record()
            self.launches.append((start, end, len(plan.rows), plan.variant.batch_capacity, plan.operation.name))
            return returned

        def timed_finish(launched):
            if launched.done is not None:
                began = time.perf_counter()
                launched.done.synchronize()
                self.wait += time.perf_counter() - began
            began = time.perf_counter()
            try:
                return finish(launched)
            finally:
                self.phases["finish"] += time.perf_counter() - began

        def timed_step():
            began = time.perf_counter()
            try:
                return step()
            finally:
                self.steps += 1
                self.wall += time.perf_counter() - began

        for owner, name, timed in ((executor, "_call", timed_call), (executor, "finish", timed_finish),
                                   (engine, "step", timed_step)):
            self._wrappers.set(owner, name, timed)

    def close(self) -> None:
        """Removes every wrapper (the engine's own methods again)."""
        self._wrappers.restore()

    def _wrap(self, owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.phases[phase] += time.perf_counter() - began

        self._wrappers.set(owner, name, timed)

    def reset(self) -> None:
        self.launches: list = []
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.wait = self.wall = 0.0
        self.steps = 0
        self.behind = self.engine.stats.second_frames

    def summary(self, batch: int) -> dict:
        """Device ms of full DECODE steps at `batch` rows, the device's idle ms before them, and host
        ms per engine step (wall less the wait for the device, and by phase)."""
        steps = max(self.steps, 1)
        out = {"steps": self.steps, "second_frames": self.engine.stats.second_frames - self.behind,
               "host_ms": 1e3 * (self.wall - self.wait) / steps, "wait_ms": 1e3 * self.wait / steps,
               "wall_ms": 1e3 * self.wall / steps,
               "phases_ms": {name: 1e3 * seconds / steps for name, seconds in self.phases.items()}}
        if self.launches:
            torch.cuda.synchronize()
            busy, idle, full = [], [], []
            for index, (previous, current) in enumerate(zip(self.launches, self.launches[1:]), 1):
                start, end, rows, capacity, operation = current
                if operation == "DECODE" and rows == capacity == batch:
                    busy.append(start.elapsed_time(end))
                    idle.append(previous[1].elapsed_time(start))
                    full.append(index)
            if busy:
                ordered = sorted(busy)
                # From the first full step's start to the last one's end, a step: what a timed loop of
                # them measures (idle gaps, slower steps and any other launch between them included).
                first, last = self.launches[full[0]], self.launches[full[-1]]
                out.update(full_steps=len(busy), device_ms=statistics.median(busy), idle_ms=statistics.mean(idle),
                           idle_median_ms=statistics.median(idle), idle_share=sum(idle) / (sum(idle) + sum(busy)),
                           device_mean_ms=statistics.mean(busy), device_p10_ms=ordered[len(busy) // 10],
                           device_p90_ms=ordered[len(busy) * 9 // 10],
                           span_step_ms=first[0].elapsed_time(last[1]) / len(busy),
                           between=full[-1] - full[0] + 1 - len(busy))
        return out

    def line(self, batch: int) -> str:
        return self.describe(self.summary(batch))

    @staticmethod
    def describe(s: dict) -> str:
        phases = ", ".join(f"{name} {ms:.2f}" for name, ms in s["phases_ms"].items())
        device = ""
        if "device_ms" in s:
            device = (f"{s['full_steps']} full steps: device {s['device_ms']:.3f} ms, idle before each "
                      f"{s['idle_ms']:.3f} ms (median {s['idle_median_ms']:.3f}, {s['idle_share']:.1%}); ")
            if "span_step_ms" in s:
                device += (f"device mean {s['device_mean_ms']:.3f} ms (p10 {s['device_p10_ms']:.3f}, p90 "
                           f"{s['device_p90_ms']:.3f}), first start to last end {s['span_step_ms']:.3f} ms a full "
                           f"step ({s['between']} other launches between); ")
        return (f"{device}{s['steps']} engine steps ({s['second_frames']} behind another): wall {s['wall_ms']:.3f} "
                f"ms, waiting {s['wait_ms']:.3f}, host {s['host_ms']:.3f} ({phases})")


class LegacyGraphs:
    """Each captured program's greedy graph as loaded (rewritten) and as before the rewrite."""

    def __init__(self, pairs: list):
        self.pairs = pairs  # (CapturedProgram, new (graph, outputs), old (graph, outputs))

    def use(self, old: bool) -> None:
        for captured, new, legacy in self.pairs:
            captured._greedy = legacy if old else new


def legacy_greedy_graphs(model) -> LegacyGraphs:
    """Captures the pre-rewrite greedy graph of every captured program with a greedy graph, then
    resets the buffers the captures' warm-up runs wrote (as `capture_programs` does at load)."""
    pool = torch.cuda.graph_pool_handle()
    pairs = []
    with torch.inference_mode():
        for program in model.programs:
            captured = program.module
            if not isinstance(captured, cuda_graphs.CapturedProgram) or not captured.has_greedy_graph:
                continue
            full = captured.eager_modules[0]
            old = cuda_graphs.variant_module(full, SampleVariant.GREEDY)
            arguments = program_arguments(program, model.weights, model.buffers)
            pairs.append((captured, captured._greedy, cuda_graphs._record(old, arguments, pool, 1)))
        torch.cuda.synchronize()
        kept = tuned_outputs(model.prepared)
        for name, tensor in model.buffers.items():
            if tensor.device.type == "cuda" and name not in kept:
                tensor.zero_()
        write_constants(model.prepared, model.buffers)
        torch.cuda.synchronize()
    return LegacyGraphs(pairs)

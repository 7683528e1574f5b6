"""Where a tensor-parallel rank spends its time: per-phase wall-clock timers.

Every rank keeps one `PhaseTimers`. Rank zero's `RankedExecutor` times encoding and sending each
step message, its own program runs (per operation) and the completion agreement; a peer times
waiting for and receiving messages, decoding them, applying admissions, its program runs and the
agreement. Rank zero collects every rank's timers with one TIMINGS exchange
(`RankedExecutor.timings`), a fixed-size float64 tensor per rank gathered over the group: the
benchmark prints them next to end-to-end time, so the rest (scheduling, admission, dispatch on
rank zero) is the difference.

Timers are owned by the thread that runs the rank's steps; `reset` and reads happen between steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Mapping

import torch

from helios.runtime.records.capacities import Operation

# Control-plane phases, then one program phase per operation ("run.decode", ...) and "run.copies"
# (a plan of cache copies alone, of no operation: a preempted request's pages offloaded).
CONTROL_PHASES = ("encode", "send", "receive", "decode", "apply", "launch", "finish", "agree")


def run_phase(operation: Operation) -> str:
    """The phase that times a plan of `operation` run in one exchange."""
    return "run.copies" if operation is Operation.UNSPECIFIED else f"run.{operation.name.lower()}"


PHASES = CONTROL_PHASES + tuple(run_phase(op) for op in Operation)


class PhaseTimers:
    """Seconds and counts per phase (names from `PHASES`)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.counts = dict.fromkeys(PHASES, 0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.counts[name] += 1

    def reset(self) -> None:
        for name in PHASES:
            self.seconds[name], self.counts[name] = 0.0, 0

    def as_tensor(self) -> torch.Tensor:
        """[2, len(PHASES)] float64: seconds, then counts (the TIMINGS exchange)."""
        return torch.tensor([[self.seconds[n] for n in PHASES], [float(self.counts[n]) for n in PHASES]],
                            dtype=torch.float64)

    @staticmethod
    def from_tensor(values: torch.Tensor) -> "PhaseTimers":
        timers = PhaseTimers()
        for index, name in enumerate(PHASES):
            timers.seconds[name] = float(values[0, index])
            timers.counts[name] = int(values[1, index])
        return timers

    def nonzero(self) -> Mapping[str, tuple[float, int]]:
        """{phase: (seconds, count)} of the phases that ran."""
        return {n: (self.seconds[n], self.counts[n]) for n in PHASES if self.counts[n]}


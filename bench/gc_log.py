"""Python's cyclic collections while a benchmark runs: how many per generation and the ms they took.

`GcLog` registers a ``gc.callbacks`` hook (benchmark instrumentation); `take()` returns what was
collected since the last `take()` as {generation: (collections, ms)} and `describe(taken)` one line.
A served step's host work runs on the engine thread, so a full collection that walks a loaded
model's millions of objects (a process that has not frozen its startup heap: `helios serve` does,
`helios.server.heap`) is a pause the device can see.
"""

from __future__ import annotations

import gc
import time


class GcLog:
    def __init__(self):
        self._started: dict[int, float] = {}
        self._taken: dict[int, list[float]] = {}
        gc.callbacks.append(self._hook)

    def close(self) -> None:
        if self._hook in gc.callbacks:
            gc.callbacks.remove(self._hook)

    def _hook(self, phase: str, info: dict) -> None:
        generation = info.get("generation", -1)
        if phase == "start":
            self._started[generation] = time.perf_counter()
        elif generation in self._started:
            self._taken.setdefault(generation, []).append(time.perf_counter() - self._started.pop(generation))

    def take(self) -> dict[int, tuple[int, float]]:
        taken, self._taken = self._taken, {}
        return {generation: (len(times), sum(times) * 1e3) for generation, times in sorted(taken.items())}


def describe(taken: dict[int, tuple[int, float]]) -> str:
    if not taken:
        return "no collections"
    return ", ".join(f"generation {g}: {count} in {ms:.1f} ms" for g, (count, ms) in taken.items())

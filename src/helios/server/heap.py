"""The serving processes' heap after startup: moved out of the cyclic garbage collector's sight.

A serving process imports torch, FastAPI, pydantic and the tokenizers and loads the model before
it serves: a million or more long-lived objects. Python's cyclic collector traverses every tracked
object of the generations it collects, and a full (oldest-generation) collection, which the steady
allocation of per-token records triggers every few seconds, walked all of them: measured with
`perf` at 64 streams on the 2-core machine, about a tenth of the serving process's CPU was
`gc_collect_main` (in whichever thread allocated when the threshold was crossed: the event loop, an
output worker). `freeze_startup_heap` collects once and freezes what is left (`gc.freeze`: those
objects go to the permanent generation, never traversed again), so later collections walk only
what was allocated while serving. The collector stays enabled: cycles made while serving are still
found. Called once by each serving process (`helios serve`'s, and its engine process) when it is
ready, before it takes requests.

`frozen_heap` is the same for a block (`helios generate`, which may run in a caller's process):
what exists when it begins is frozen, without a collection first, and unfrozen when it ends. A
first large batch after a load otherwise pays one full collection over the load's objects: 256 ms
in the middle of an 8B core's first 256-row decode (`bench/results/h200_session31_call3`).

The C allocator's side (freed memory kept by the process) is `helios.runtime.host_heap`.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


def freeze_startup_heap() -> int:
    """Collects, then freezes every object left; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()



@contextlib.contextmanager
def frozen_heap() -> Iterator[int]:
    """Freezes every object that exists now for the block (yields how many are frozen) and unfreezes
    them after it: they go back to the oldest generation, where a later collection finds any garbage
    among them. Not nested in a process whose heap is frozen for good (`freeze_startup_heap`)."""
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()

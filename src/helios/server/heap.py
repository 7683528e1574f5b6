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

The C allocator's side (freed memory kept by the process) is `helios.runtime.host_heap`.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collects, then freezes every object left; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


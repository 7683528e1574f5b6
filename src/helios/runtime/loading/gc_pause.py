"""Python's cyclic garbage collector paused while a model loads.

A load allocates millions of small, mostly long-lived objects (the programs' graph JSON, their fx
graphs and the capture's copies of them): each allocation threshold the collector reaches makes it
walk the young objects again, and every tenth walk the older ones, about a third of the load's
Python time (the 32-layer study core's 22 programs and capture plans on the CPU: 2.9-3.1 s with
the collector, 1.9-2.1 s without, the peak resident memory within 3 MB). `paused()` disables it for
the block and, when the last block of the process ends, enables it again and collects the youngest
generation once: what the load left as garbage cycles (its discarded graph copies) is freed there,
before the model is ready, instead of at the first step's allocations.

Blocks may nest and overlap across threads (tensor-parallel ranks load side by side): the collector
stays paused until the last one ends, and stays disabled afterwards if it was disabled before the
first one began.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_LOCK = threading.Lock()
_paused = 0  # blocks running now
_was_enabled = False  # the collector's state when the first of them began


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector disabled within the block (module docstring)."""
    global _paused, _was_enabled
    with _LOCK:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _LOCK:
            _paused -= 1
            resume = _paused == 0 and _was_enabled
            if resume:
                gc.enable()
        if resume:
            gc.collect(0)

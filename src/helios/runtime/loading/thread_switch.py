"""Python's thread switch interval shortened while a model loads.

A load runs its loading thread (programs, capture plans, the precompile's dry run, the capture)
beside the weight threads. Each time the loading thread gives up the GIL (a kernel launch, a CUDA
call, a read), a weight thread takes it, and the loading thread gets it back only when that thread
gives it up or the switch interval (`sys.getswitchinterval`, 5 ms by default) forces it to: the dry
run's tens of thousands of short calls waited most of their time. With 0.5 ms, an 8B-shaped core's
load on an H200 (bench/results/h200_session45_call5, fresh processes, alternated) ran its dry run in
1.6-2.3 s against 4.4-5.1 s, and loaded in 10.9 / 13.8 s against 13.3 / 14.7 s on a warm Triton cache
and 15.0 against 18.0 s on an empty one; the weights came no slower (6.2-6.5 s against 7.2-7.6).

`shortened()` sets `LOAD_SWITCH_INTERVAL` for the block (never lengthens one set shorter) and puts
the interval back when the last block of the process ends: serving runs at the interval it had.
Blocks may nest and overlap across threads (tensor-parallel ranks load side by side).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

LOAD_SWITCH_INTERVAL = 0.0005  # seconds
_LOCK = threading.Lock()
_blocks = 0  # blocks running now
_before = 0.0  # the interval when the first of them began


@contextlib.contextmanager
def shortened(interval: float | None = None) -> Iterator[None]:
    """The switch interval at most `interval` (default `LOAD_SWITCH_INTERVAL`) within the block."""
    global _blocks, _before
    interval = LOAD_SWITCH_INTERVAL if interval is None else interval
    with _LOCK:
        if _blocks == 0:
            _before = sys.getswitchinterval()
        _blocks += 1
        if interval < sys.getswitchinterval():
            sys.setswitchinterval(interval)
    try:
        yield
    finally:
        with _LOCK:
            _blocks -= 1
            if _blocks == 0:
                sys.setswitchinterval(_before)

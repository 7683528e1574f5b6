"""The serving processes' heap after startup: moved out of the cyclic garbage collector's sight,
and the C allocator told to keep memory it gets back instead of returning it to the kernel.

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

`hold_freed_memory` fixes glibc malloc's two thresholds, which it otherwise moves by itself: the
size from which a block is its own `mmap` (`M_MMAP_THRESHOLD`, at glibc's largest, 32 MiB) and the
free space at the top of a heap from which the heap is handed back (`M_TRIM_THRESHOLD`, 256 MiB).
A CPU decode step allocates and frees a few megabytes of tensors; with glibc's moving thresholds
the model worker's thread arena, depending on the order of earlier frees, handed about 4.5 MB
back with `madvise(MADV_DONTNEED)` at the end of every step and took about 900 fresh zeroed pages
again the next (measured on the 2-core machine at 64 streams, the embedded model: 23-41 us of kernel
CPU per token and 111-155 us per token in all, against 0 faults and 79-87 us per token with the
thresholds fixed). The cost: up to `TRIM_THRESHOLD` of freed memory per heap stays with the
process. Called once by each serving process: the engine process before it loads the model,
`helios serve`'s when it is ready (with `--no-engine-process` its model worker is a thread of that
process and runs its steps under the fixed thresholds).
"""

from __future__ import annotations

import ctypes
import gc
import platform

MMAP_THRESHOLD = 32 << 20  # glibc's upper bound for M_MMAP_THRESHOLD on 64-bit systems
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def freeze_startup_heap() -> int:
    """Collects, then freezes every object left; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def hold_freed_memory() -> bool:
    """Fixes glibc malloc's mmap and trim thresholds for this process (see the module docstring);
    False, and nothing changed, where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))

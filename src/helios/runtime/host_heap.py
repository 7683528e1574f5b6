"""The C allocator told to keep the memory a process frees instead of handing it back to the kernel.

Fixes glibc malloc's two thresholds, which it otherwise moves by itself: the
size from which a block is its own `mmap` (`M_MMAP_THRESHOLD`, at glibc's largest, 32 MiB) and the
free space at the top of a heap from which the heap is handed back (`M_TRIM_THRESHOLD`, 256 MiB).
A CPU decode step allocates and frees a few megabytes of tensors; with glibc's moving thresholds
the model worker's thread arena, depending on the order of earlier frees, handed about 4.5 MB
back with `madvise(MADV_DONTNEED)` at the end of every step and took about 900 fresh zeroed pages
again the next (measured on the 2-core machine at 64 streams, the embedded model: 23-41 us of kernel
CPU per token and 111-155 us per token in all, against 0 faults and 79-87 us per token with the
thresholds fixed). The cost: up to `TRIM_THRESHOLD` of freed memory per heap stays with the
process. `build_runtime` calls it (`RuntimeOptions.hold_freed_memory`, on by default), so every
process that runs an engine does: `helios serve`'s engine process, the thread of
`--no-engine-process`, `helios generate` and an embedding program; `helios serve`'s own process
calls it as well when it is ready.
"""

from __future__ import annotations

import ctypes
import platform

MMAP_THRESHOLD = 32 << 20  # glibc's upper bound for M_MMAP_THRESHOLD on 64-bit systems
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


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

"""Whether what a load is about to allocate fits the memory of its device, checked first.

A verified core can still declare sizes this machine cannot hold (a publisher's mistake, or a
hostile but trusted signer); allocating them would end in `MemoryError`, an out-of-memory kill or
a CUDA allocator failure halfway through a load. `check_fits` turns that into one typed
`InsufficientMemoryError` before the first allocation.
"""

from __future__ import annotations

import torch

from helios.core.streams import available_memory_nbytes
from helios.errors import LoadError


class InsufficientMemoryError(LoadError):
    """The core needs more memory on the serving device than it has available."""


def available_nbytes(device: torch.device) -> int | None:
    """Free memory of `device` now (CUDA: the allocator's view; CPU: MemAvailable); None if unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return available_memory_nbytes()


def check_fits(what: str, nbytes: int, device: torch.device, remedy: str = "") -> None:
    """`InsufficientMemoryError` when `nbytes` exceed what `device` has available now (`remedy`, if
    any, ends the message)."""
    available = available_nbytes(device)
    if available is not None and nbytes > available:
        raise InsufficientMemoryError(
            f"{what} need {nbytes} bytes on {device}; {available} bytes are available{remedy}")

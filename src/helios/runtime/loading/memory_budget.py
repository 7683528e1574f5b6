"""Whether what a load is about to allocate fits the memory of its device, checked first.

A verified core can still declare sizes this machine cannot hold (a publisher's mistake, or a
hostile but trusted signer); allocating them would end in `MemoryError`, an out-of-memory kill or
a CUDA allocator failure halfway through a load. `check_fits` turns that into one typed
`InsufficientMemoryError` before the first allocation. The host page slots of offload
preemption (`--host-pages N`, sized by the operator, not the core) are checked the same way
against the host's available memory by `host_pages_allocation`, which also turns the
allocator's own failure into that error.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

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


def _host_pages_message(host_pages: int, nbytes: int, available: int | None) -> str:
    found = f"{available} bytes are available" if available is not None else "the allocator could not hold them"
    return (f"--host-pages {host_pages}: the host page slots need {nbytes} bytes of host memory; {found} "
            "(fewer host pages: --host-pages N)")


@contextmanager
def host_pages_allocation(host_pages: int, nbytes: int) -> Iterator[None]:
    """Guards the allocation of `host_pages` host page slots of `nbytes` bytes in all: refused with
    `InsufficientMemoryError` before it when they exceed the host's available memory (unknown:
    not checked), and the allocator's own `RuntimeError`/`MemoryError` turned into the same error."""
    available = available_nbytes(torch.device("cpu"))
    if available is not None and nbytes > available:
        raise InsufficientMemoryError(_host_pages_message(host_pages, nbytes, available))
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        raise InsufficientMemoryError(_host_pages_message(host_pages, nbytes, None)) from error

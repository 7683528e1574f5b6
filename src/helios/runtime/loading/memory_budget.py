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


@contextmanager
def allocation_within(what: str, nbytes: int, device: torch.device, remedy: str,
                      where: str | None = None) -> Iterator[None]:
    """Guards an allocation of `nbytes` bytes on `device` sized by an operator's option (`what`
    names it and what it allocates): refused with `InsufficientMemoryError` before it when it
    exceeds the available memory (unknown: not checked), and the allocator's own
    `RuntimeError`/`MemoryError` turned into the same error; `remedy` ends the message, `where`
    (default "on <device>") follows the byte count."""
    where = where or f"on {device}"
    available = available_nbytes(device)
    if available is not None and nbytes > available:
        raise InsufficientMemoryError(f"{what} need {nbytes} bytes {where}; {available} bytes are available "
                                      f"({remedy})")
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        raise InsufficientMemoryError(f"{what} need {nbytes} bytes {where}; the allocator could not hold them "
                                      f"({remedy})") from error


def host_pages_allocation(host_pages: int, nbytes: int):
    """Guards the allocation of `host_pages` host page slots of `nbytes` bytes in all
    (`allocation_within` on the host)."""
    return allocation_within(f"--host-pages {host_pages}: the host page slots", nbytes, torch.device("cpu"),
                             "fewer host pages: --host-pages N", where="of host memory")

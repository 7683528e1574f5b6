"""How many physical cache pages a model gets when the startup options name no count.

On the CPU: the contract's page capacity, or as many pages as fit in the memory fraction of the
memory available (Linux's MemAvailable) beside the other buffers where that is fewer (logged: a
core prepared for a larger machine still serves, with fewer contexts at once). On CUDA: as many pages as fit in a fraction of the
device memory that is free after weights and programs are loaded, less every other buffer the
model allocates (state rows, inputs, outputs), never fewer than one request's context needs and at
most `MAX_DEFAULT_PAGES`.
A page costs the bytes of one page of every buffer sized by PHYSICAL_PAGES; the pages of a window
region with its own page ids (WINDOW_PAGES, a count fixed before) come out of the budget first.
"""

from __future__ import annotations

import logging
import math

import torch

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract.dtypes import element_bytes
from helios.errors import LoadError
from helios.runtime.loading.memory_budget import available_nbytes

_LOG = logging.getLogger(__name__)

# Host bookkeeping (free lists, page tables) grows with the page count: a small model on a large
# device stops here (an 8B model's pages run out of memory long before).
MAX_DEFAULT_PAGES = 1 << 18


class CacheMemoryError(LoadError):
    """The free device memory cannot hold the pages one request needs."""


def page_bytes(prepared: PreparedContract) -> int:
    """Bytes of one physical page over every buffer sized by PHYSICAL_PAGES."""
    per_page = 0
    for buffer in prepared.manifest.buffers:
        extents = [d.load_extent for d in buffer.shape if d.WhichOneof("extent") == "load_extent"]
        if buffer.role != mpb.BUFFER_ROLE_WEIGHT and mpb.LOAD_EXTENT_PHYSICAL_PAGES in extents:
            per_page += element_bytes(buffer.dtype) * math.prod(d.size for d in buffer.shape if d.size)
    return per_page


def other_bytes(prepared: PreparedContract, num_state_rows: int, num_window_pages: int = 0) -> int:
    """Bytes of the non-weight buffers not sized by pages, at `num_state_rows` state rows and
    `num_window_pages` pages of a window region that owns its page ids."""
    total = 0
    for buffer in prepared.manifest.buffers:
        extents = [d.load_extent for d in buffer.shape if d.WhichOneof("extent") == "load_extent"]
        if buffer.role == mpb.BUFFER_ROLE_WEIGHT or mpb.LOAD_EXTENT_PHYSICAL_PAGES in extents:
            continue
        rows = num_state_rows if mpb.LOAD_EXTENT_STATE_ROWS in extents else 1
        rows *= num_window_pages if mpb.LOAD_EXTENT_WINDOW_PAGES in extents else 1
        total += element_bytes(buffer.dtype) * math.prod(d.size for d in buffer.shape if d.size) * rows
    return total


def pages_for_memory(prepared: PreparedContract, free_bytes: int, fraction: float, num_state_rows: int,
                     min_pages: int, num_window_pages: int = 0, most: int = MAX_DEFAULT_PAGES) -> int:
    """Pages that fit in `fraction` of `free_bytes` beside the other buffers (at least `min_pages`,
    at most `most`)."""
    if not 0 < fraction <= 1:
        raise LoadError(f"the cache memory fraction must be in (0, 1], got {fraction}")
    per_page = page_bytes(prepared)
    budget = int(free_bytes * fraction) - other_bytes(prepared, num_state_rows, num_window_pages)
    pages = budget // per_page if per_page else 0
    if pages < min_pages:
        raise CacheMemoryError(f"{fraction:.0%} of the {free_bytes / 2**30:.2f} GiB free holds {max(pages, 0)} cache "
                               f"pages of {per_page} bytes; one request needs {min_pages}")
    return min(pages, most)


def default_pages(prepared: PreparedContract, device: torch.device, fraction: float, num_state_rows: int,
                  min_pages: int, contract_pages: int, num_window_pages: int = 0) -> int:
    """The page count without an explicit option: sized from free memory on CUDA; elsewhere the
    contract's, or what fits the available memory where that is fewer (see the module docstring)."""
    available = available_nbytes(device)  # CUDA: the free device memory; the CPU: MemAvailable
    if device.type == "cuda":
        return pages_for_memory(prepared, available, fraction, num_state_rows, min_pages, num_window_pages)
    if available is None:
        return contract_pages
    fitting = pages_for_memory(prepared, available, fraction, num_state_rows, min_pages, num_window_pages,
                               most=contract_pages)
    if fitting < contract_pages:
        _LOG.warning("the core's %d cache pages need %.2f GiB; %.0f%% of the %.2f GiB of memory available holds %d: "
                     "serving with %d (--pages N to choose)", contract_pages,
                     (contract_pages * page_bytes(prepared)) / 2**30, fraction * 100, available / 2**30, fitting,
                     fitting)
    return fitting

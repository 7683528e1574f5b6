"""The Triton precompile's dry run made while the weights load, on stand-in arguments.

The capture's dry run (`helios.runtime.loading.kernel_precompile`) finds the Triton variants its warm-up
runs would compile, so that worker processes compile them side by side; made at capture time, after
the weights and the buffers exist, the compiles end seconds after it (an 8B core's first load on an
H200: a 3.3-4.3 s dry run, then 3-5.5 s waiting for the workers, bench/results/h200_session26_call3).
Which variant a launch needs depends on the shapes, dtypes, strides and alignment of its arguments
and on the integers it is given, never on the values the weights hold. So a single-rank CUDA load
dry-runs each program's capture plan as soon as it is built (`cuda_graphs.plan_captures`), while the
weight thread still reads, on stand-ins:

- each weight: zeros of its manifest dtype and shape, on its placement's device, one tensor shared
  by every weight of the same shape (32 layers need one of each), a few GB for an 8B core;
- every other buffer: allocated as the load allocates them (`_allocate`), with a cache of just
  enough pages for one context (or, where a program takes a static page extent, that many:
  `helios.runtime.loading.model.static_pages`), the load's state rows and window pages, its
  constants written and the tuning producers run on them.

The workers then compile while the plans are built and the weights load, and the capture only
waits for what is left (`KernelCompiler.ran_ahead`). What it changes is when the compiles happen,
never a result: a variant the stand-ins did not reveal is compiled by its warm-up run as before,
and a plan whose arguments the stand-ins cannot give is left to the capture's dry run (logged).
It is made only where it is safe to: one rank (a tensor-parallel rank's plans run collectives,
which every rank must make in the same order), and only if the stand-ins and the whole weights fit
the free device memory twice over; they are freed (their device storages emptied: something, not
yet identified, kept 1.4 GB of an 8B core's stand-in weights referenced through the capture,
bench/results/h100_session52_call3), and the device's cache emptied, before the pages are sized.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Mapping

import torch

from helios.contract import manifest_pb2 as mpb
from helios.runtime.loading.cuda_graphs import dry_run_plan

_LOG = logging.getLogger(__name__)
MARGIN_BYTES = 2 << 30  # beyond twice the stand-ins (activations of the largest plan's dry run)


class DryRunAhead:
    """Runs each capture plan it is given (`__call__`, `plan_captures`'s `ahead`) in `compiler`'s dry
    run on `arguments_of(program)` (the stand-ins); `close` waits for the device and frees them."""

    def __init__(self, compiler, arguments: list, arguments_of: Callable, device: torch.device):
        self.compiler, self.arguments_of = compiler, arguments_of
        self._arguments = arguments  # every stand-in: skipped launches never zero them; `close` frees them
        self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        self.seconds = 0.0
        self.plans = 0

    def __call__(self, plan) -> None:
        """Dry-runs `plan` on the stand-ins; a plan whose arguments the stand-ins cannot give is left
        to the capture's own dry run (logged), never failing the load."""
        started = time.perf_counter()
        try:
            arguments = self.arguments_of(plan.program)
        except Exception as error:  # noqa: BLE001 - the capture's dry run finds its variants instead
            _LOG.info("the Triton precompile's dry run leaves %s to the capture (stand-ins: %s: %s)", plan.name,
                      type(error).__name__, error)
            return
        with self.compiler.dry_run(self._arguments), torch.cuda.stream(self._stream):
            dry_run_plan(plan, arguments, self.compiler)
        self.plans += 1
        self.seconds += time.perf_counter() - started

    def close(self) -> None:
        """Waits for the dry run's device work, drops the stand-ins and empties the device's cache (the
        pages are sized from the free memory next); the capture then only awaits the compiles."""
        self._stream.synchronize()
        for tensor in self._arguments:  # referenced beyond the dry run (see the module docstring): memory back now
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                tensor.untyped_storage().resize_(0)
        self._arguments = self.arguments_of = None
        self.compiler.ran_ahead = self.plans > 0
        self.compiler.ahead_seconds = self.seconds
        torch.cuda.empty_cache()


def stand_in_weights(manifest, dtypes: Mapping, device: torch.device) -> dict[str, torch.Tensor]:
    """Zeros for each WEIGHT buffer: its dtype (`dtypes`: the manifest's to torch's) and shape, on the
    CPU when it is placed on the host, one tensor per (shape, dtype, placement)."""
    shared: dict[tuple, torch.Tensor] = {}
    weights = {}
    for buffer in manifest.buffers:
        if buffer.role != mpb.BUFFER_ROLE_WEIGHT:
            continue
        on_host = buffer.placement == mpb.PLACEMENT_HOST
        key = (tuple(dim.size for dim in buffer.shape), buffer.dtype, on_host)
        if key not in shared:
            shared[key] = torch.zeros(key[0], dtype=dtypes[buffer.dtype], device="cpu" if on_host else device)
        weights[buffer.name] = shared[key]
    return weights


def weight_bytes(manifest, dtypes: Mapping, distinct: bool) -> int:
    """Bytes of the WEIGHT buffers (`distinct`: one per (shape, dtype), as the stand-ins hold them)."""
    sizes = {}
    for buffer in manifest.buffers:
        if buffer.role == mpb.BUFFER_ROLE_WEIGHT:
            shape = tuple(dim.size for dim in buffer.shape)
            key = (shape, buffer.dtype) if distinct else buffer.name
            sizes[key] = math.prod(shape) * dtypes[buffer.dtype].itemsize
    return sum(sizes.values())


def fits_twice(manifest, dtypes: Mapping, buffers: int, device: torch.device) -> bool:
    """Whether the stand-ins (distinct weights and `buffers` bytes of buffers, allocated already),
    twice over, and every weight fit the device's free memory now (as if none were loaded yet)."""
    free, _ = torch.cuda.mem_get_info(device)
    stand_ins = weight_bytes(manifest, dtypes, distinct=True) + buffers
    return free + buffers >= weight_bytes(manifest, dtypes, distinct=False) + 2 * stand_ins + MARGIN_BYTES


def buffer_bytes(buffers: Mapping[str, torch.Tensor]) -> int:
    """Bytes of `buffers`' storages, each counted once (buffers sharing an arena share it)."""
    storages = {}
    for tensor in buffers.values():
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())

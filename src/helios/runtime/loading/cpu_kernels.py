"""C++ kernels for the CPU programs' ABI bodies, bound at load (`LoadOptions.cpu_kernels`).

A CPU program's fast graph (`helios.runtime.loading.cpu_fast`) calls each ABI op's Python body, a
few torch calls of a few microseconds each around tiny tensors, and MKL's sgemm for each projection.
Where a C++ compiler is installed, the load builds seven kernels through Inductor's C++ toolchain
(`helios.runtime.loading.cpp_kernels`; about 2 s each the first time on a machine, then loaded
from its on-disk cache) and points every program's fast graph at them:

- projections over weights packed at load (`helios.runtime.loading.linear_kernel`: one packed copy
  of each weight, within a share of the memory available; within float rounding of MKL's);
- a full decode step's paged attention (`helios.runtime.loading.decode_attention_kernel`: each row's
  pages walked in place, no gather copies or masks; within float rounding of the reference);
- cache writes (`cache_write_kernel`, bit for bit) and greedy sampling (`greedy_kernel`, bit for bit);
- RMSNorm and add + RMSNorm (within float rounding), SiLU-mul, rotary + cache write (bit for bit)
  (`helios.runtime.loading.fused_cpu_kernels`).

Each replacement runs its body wherever the kernel does not take the tensors (another dtype or
layout: a property of the call site, the same in every program and step; padding slots, which
the bodies write bit for bit as the kernels do), so every program still computes what its bodies
compute, within float rounding where stated, and a token's values do not depend on the step it
runs in. For that, the load binds them only where every program has a fast graph, and runs each
program's first (checked) call at load (`check_ahead`), so that no serving step runs the bodies.
`--compile-programs` (`helios.runtime.loading.program_compile`) binds its own (Inductor compiles
the rest), so a load does one or the other.

`cpu_kernels=None` (the default) binds them where a C++ compiler is found and the build succeeds,
else serves with the bodies and logs why; True requires them (`CpuKernelError` otherwise); False
never builds them.

Thread ownership: built and bound at load, before the engine starts; calls run on the model worker.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import torch

from helios.errors import LoadError
from helios.runtime.loading import cache_write_kernel, decode_attention_kernel, greedy_kernel, linear_kernel
from helios.runtime.loading.cpp_kernels import compiler_available
from helios.runtime.loading.cpu_programs import CpuProgram
from helios.runtime.loading.fused_cpu_kernels import FusedKernels, bind_fused_kernels, build_kernels
from helios.runtime.loading.linear_kernel import PackedWeights, bind_linears

_LOG = logging.getLogger(__name__)
COLD_BUILD_SECONDS = 1.0  # kernels this slow to get ready were most likely compiled: worth a progress line
SLOW_PACK_SECONDS = 1.0  # packing the projection weights this long is worth a progress line
SLOW_CHECK_SECONDS = 1.0  # first checked calls running this long so far: a progress line per program


class CpuKernelError(LoadError):
    """The CPU kernels were required (`LoadOptions.cpu_kernels=True`) but could not be built."""


class CpuKernels(NamedTuple):
    """The built kernels."""

    attention: Callable
    writes: Callable
    greedy: Callable
    fused: FusedKernels
    linear: Callable


def build_cpu_kernels() -> CpuKernels:
    """Every kernel, built (or loaded from Inductor's cache) once per process. Raises what the
    toolchain raises."""
    return CpuKernels(decode_attention_kernel.build_kernel(), cache_write_kernel.build_kernel(),
                      greedy_kernel.build_kernel(), build_kernels(), linear_kernel.build_kernel())


def bind_cpu_kernels(graph: torch.fx.Graph, kernels: CpuKernels, weights: Sequence[torch.Tensor] = (),
                     packs: PackedWeights | None = None) -> int:
    """Points `graph`'s attention, cache write, sampling, norm, SiLU-mul and rotary calls at the
    kernels' bodies, and with `packs` its projections over the program's `weights`; returns how many
    calls."""
    return (decode_attention_kernel.bind_decode_attention(graph, kernels.attention)
            + cache_write_kernel.bind_cache_writes(graph, kernels.writes)
            + greedy_kernel.bind_greedy_sampling(graph, kernels.greedy)
            + bind_fused_kernels(graph, kernels.fused)
            + (bind_linears(graph, kernels.linear, weights, packs) if packs is not None else 0))


def use_cpu_kernels(programs: Iterable, required: bool | None, progress: Callable[[str], None] | None = None,
                    weights_of: Callable[[object], Sequence[torch.Tensor]] | None = None) -> int:
    """Binds the kernels into every program's fast graph (`LoadedProgram`s) as `required` says (module
    docstring), the projection kernel where `weights_of(program)` gives its weight list (packed once
    each for all programs: `PackedWeights.for_this_machine`); returns how many calls were bound.
    Only where every program is a `CpuProgram` with a fast graph: a program that runs its checked
    bodies every call would compute a token's values in other float rounding than the others, so
    then none is bound (logged)."""
    programs = list(programs)
    modules = [p.module for p in programs]
    if required is False or not modules:
        return 0
    if not all(isinstance(m, CpuProgram) and m.fast is not None for m in modules):
        if required:
            raise CpuKernelError("the CPU kernels need every program checked once (a fast graph); this core has "
                                 "programs that are checked every call")
        _LOG.info("a program has no fast graph: the CPU programs run their Python bodies")
        return 0
    kernels = _built(required, progress or (lambda line: None))
    if kernels is None:
        return 0
    packs = PackedWeights.for_this_machine() if weights_of is not None else None
    started = time.perf_counter()
    count = 0
    for program in programs:
        weights = weights_of(program) if weights_of is not None else ()
        count += program.module.bind_fast(
            lambda graph, weights=weights: bind_cpu_kernels(graph, kernels, weights, packs))
    elapsed = time.perf_counter() - started
    if packs is not None and elapsed >= SLOW_PACK_SECONDS and progress is not None:
        progress(f"packed {packs.count} projection weights ({packs.bytes / 2**30:.2f} GiB) for the CPU kernels "
                 f"in {elapsed:.1f} s")
    if weights_of is not None and progress is not None:
        dtypes = {str(w.dtype).removeprefix("torch.") for program in programs for w in weights_of(program)}
        if dtypes and "float32" not in dtypes:
            progress(f"the CPU kernels compute in float32: this core's {', '.join(sorted(dtypes))} weights keep "
                     "torch's linear and the Python bodies (about half a float32 step's rate; a core prepared "
                     "with --dtype float32 takes the kernels)")
    return count


def check_ahead(programs: Iterable, arguments_of: Callable[[object], list], buffers: Mapping[str, torch.Tensor],
                keep: Iterable[str] = (), progress: Callable[[str], None] | None = None) -> None:
    """Runs each program's first, checked call now, at load, on its arguments (`arguments_of(program)`,
    the buffers as they are at load), then zeroes every buffer but those in `keep` (the caller writes
    the constants again), as a CUDA load's warm-up does: every call while serving then runs the
    fast graph, so each token's values come from the same kernels in every step (the checked
    graph's bodies round otherwise). Raises what a program raises. A full forward of every program
    on the bodies: for a large model's prompt programs, seconds to minutes on the CPU, so once the
    calls have taken `SLOW_CHECK_SECONDS` each program done is shown on `progress`."""
    programs = list(programs)
    started = time.perf_counter()
    with torch.inference_mode():
        for index, program in enumerate(programs, 1):
            began = time.perf_counter()
            program.module(*arguments_of(program))
            done = time.perf_counter()
            if progress is not None and done - started >= SLOW_CHECK_SECONDS:
                progress(f"ran the first (checked) call of {program.graph} R={program.batch_capacity} "
                         f"T={program.packed_token_capacity} in {done - began:.1f} s [{index}/{len(programs)}]")
    kept = set(keep)
    for name, tensor in buffers.items():
        if name not in kept:
            tensor.zero_()


def _built(required: bool | None, say: Callable[[str], None]) -> CpuKernels | None:
    if compiler_available() is None:
        if required:
            raise CpuKernelError("the CPU kernels need a C++ compiler (g++ or clang++ on PATH, or CXX); install one "
                                 "or load without them")
        _LOG.info("no C++ compiler found: the CPU programs run their Python bodies")
        return None
    started = time.perf_counter()
    try:
        kernels = build_cpu_kernels()
    except Exception as error:  # the toolchain's failures have no common type
        if required:
            raise CpuKernelError(f"building the CPU kernels failed: {type(error).__name__}: {error}") from error
        _LOG.warning("building the CPU kernels failed (%s: %s): the CPU programs run their Python bodies",
                     type(error).__name__, error)
        return None
    elapsed = time.perf_counter() - started
    if elapsed >= COLD_BUILD_SECONDS:
        say(f"CPU kernels ready in {elapsed:.1f} s (built, or loaded from Inductor's cache)")
    return kernels

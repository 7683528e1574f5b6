"""Shared test configuration: GPU tests are skipped where no CUDA device is present."""

from __future__ import annotations

import concurrent.futures
import os
import platform

import pytest
import torch

from helios.runtime.loading.program_cache import keep_deserialized_programs

# The CI machine has 2 cores; several-threaded torch on tiny tensors is much slower there.
torch.set_num_threads(1)
# Tests build many runtimes of a few cores in one process: each program's graph is deserialized once
# (a later load of the same bytes still checks it and gets its own module and tensors).
keep_deserialized_programs(64)


def _share_vector_isa_probe() -> None:
    """Spares the processes the tests start (servers, engine and rank processes) Inductor's probe of
    the CPU's vector instruction sets: a compile and a Python subprocess for each set, about 1 s of CPU
    in every process that builds CPU kernels. Where this process's probe found every set the CPU's
    flags name usable, ``TORCHINDUCTOR_VEC_ISA_OK=1`` gives the children that same list without
    probing again (same machine, same compiler); otherwise they probe as before."""
    if "TORCHINDUCTOR_VEC_ISA_OK" in os.environ or platform.machine() not in ("x86_64", "AMD64"):
        return
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    named = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]
    # Each set's probe is a compile (about 2 s of CPU) then a load in a subprocess; the sets' probes
    # are independent and cached per set, so they run side by side (the workers have not started yet).
    with concurrent.futures.ThreadPoolExecutor(max(len(named), 1)) as pool:
        list(pool.map(bool, named))
    if named and cpu_vec_isa.valid_vec_isa_list() == named:
        os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"


_share_vector_isa_probe()


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a setup failure reported elsewhere
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

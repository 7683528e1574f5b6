"""C++ kernels of CPU programs, built at load through Inductor's C++ toolchain (a C++ compiler on
PATH, or ``CXX``) and its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``): each source once per process,
compiled once per machine (and the vector instruction set they are built for probed once per machine,
`helios.runtime.loading.vector_isa`).

Thread ownership: built at load; the returned calls run on the model worker.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Sequence

_BUILT: dict[str, Callable] = {}


def build_cpp_kernel(argument_types: Sequence[str], source: str) -> Callable:
    """The Python binding of `source`'s ``kernel`` function taking `argument_types` (C types), built
    once per process. Raises what the toolchain raises when it cannot build it."""
    kernel = _BUILT.get(source)
    if kernel is None:
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        from helios.runtime.loading.vector_isa import settle_vector_isa

        settle_vector_isa(compiler_available())  # the first build of the process: its probes, once per machine

        kernel = _BUILT[source] = CppPythonBindingsCodeCache.load_pybinding(list(argument_types), source)
    return kernel


def compiler_available() -> str | None:
    """The C++ compiler Inductor would run (its ``cpp.cxx`` setting or ``CXX``), if installed."""
    from torch._inductor import config

    configured = os.environ.get("CXX") or (config.cpp.cxx[1] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx)
    for name in (configured, "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def layouts(*tensors) -> tuple:
    """What a kernel's checks of its tensors read, flat (dtype, whether on the CPU, shape, strides per
    tensor): a call site compares it with its last checked call's on every call (about 0.3 us a tensor)."""
    signature = ()
    for t in tensors:
        signature += (t.dtype, t.is_cpu, t.shape, t.stride())
    return signature

"""C++ kernels of compiled CPU programs, built at load through Inductor's C++ toolchain (the compiler
``--compile-programs`` already needs) and its on-disk cache: each source once per process.

Thread ownership: built at load; the returned calls run on the model worker.
"""

from __future__ import annotations

from typing import Callable, Sequence

_BUILT: dict[str, Callable] = {}


def build_cpp_kernel(argument_types: Sequence[str], source: str) -> Callable:
    """The Python binding of `source`'s ``kernel`` function taking `argument_types` (C types), built
    once per process. Raises what the toolchain raises when it cannot build it."""
    kernel = _BUILT.get(source)
    if kernel is None:
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        kernel = _BUILT[source] = CppPythonBindingsCodeCache.load_pybinding(list(argument_types), source)
    return kernel

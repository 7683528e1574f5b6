"""Shared test configuration: GPU tests are skipped where no CUDA device is present."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.loading.program_cache import keep_deserialized_programs

# The CI machine has 2 cores; several-threaded torch on tiny tensors is much slower there.
torch.set_num_threads(1)
# Tests build many runtimes of a few cores in one process: each program's graph is deserialized once
# (a later load of the same bytes still checks it and gets its own module and tensors).
keep_deserialized_programs(64)


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

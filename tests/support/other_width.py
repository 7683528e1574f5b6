"""A C++ kernel built for 256-bit vectors (AVX2) on a machine whose widest is 512: Inductor picks a
process's vector width once, so the check runs in a fresh process (`run_at_256_bits`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PRELUDE = r"""
import sys, torch
from torch._inductor import config
config.cpp.simdlen = 256
from torch._inductor import cpu_vec_isa
if "avx2" not in str(cpu_vec_isa.pick_vec_isa()):
    print("no avx2"); sys.exit(0)
"""


def run_at_256_bits(script: str) -> None:
    """Runs `script` (which builds its kernels, checks them and prints "ok" last) in a fresh process
    whose C++ kernels are built for 256-bit vectors; skips where the CPU has no AVX2."""
    result = subprocess.run([sys.executable, "-c", _PRELUDE + script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    if last == "no avx2":
        pytest.skip("this CPU has no AVX2")
    assert last == "ok"

"""Runs one of tests/abi's `compile_*_kernels.py` scripts: the Triton compiler, stricter than the
interpreter, builds kernels for a Hopper GPU (PTX and ptxas, sm_90) without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ABI_TESTS = Path(__file__).resolve().parent.parent / "abi"
# A hang guard, not a time limit: on a 2-core machine beside the other test worker, the attention
# kernels' compile has taken over 240 s.
HANG_GUARD_S = 900


def compile_for_hopper(script: str) -> None:
    """Runs tests/abi/`script` without TRITON_INTERPRET; fails with its output when it fails."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ABI_TESTS), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, str(ABI_TESTS / script)], env=env, capture_output=True, text=True,
                            timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stdout + result.stderr

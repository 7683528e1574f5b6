"""Runs tests/abi's `compile_*_kernels.py` scripts: the Triton compiler, stricter than the
interpreter, builds kernels for a Hopper GPU (PTX and ptxas, sm_90) without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ABI_TESTS = Path(__file__).resolve().parent.parent / "abi"
# A hang guard, not a time limit: on a 2-core machine beside the other test worker, the attention
# kernels' compile has taken over 240 s (all the scripts together take about twice as long).
HANG_GUARD_S = 1800

# Runs each script as `__main__` in turn in one process (one import of torch, helios and Triton's
# backend for all of them), goes on past a failing one and exits non-zero naming every one that failed.
_DRIVER = """
import runpy, sys, traceback
failed = []
for script in sys.argv[1:]:
    print(f"=== {script}", flush=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (0, None):
            failed.append(script)
    except BaseException:
        traceback.print_exc()
        failed.append(script)
sys.exit(f"failed: {failed}" if failed else 0)
"""


def compile_for_hopper(*scripts: str) -> None:
    """Runs tests/abi/`scripts` (in one process) without TRITON_INTERPRET; fails with the output when
    any of them fails."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ABI_TESTS), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", _DRIVER, *(str(ABI_TESTS / script) for script in scripts)],
                            env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stdout + result.stderr

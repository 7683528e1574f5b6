"""`HELIOS_START_TRACE=1`: `helios serve` prints to standard error when its start reaches each step,
in the serving process and in the engine process, as ``helios start trace: EPOCH_SECONDS pid PID STEP``
lines (`bench/serve_ready.py --trace` lays them out against the launch). Off, a mark costs one
environment lookup.
"""

from __future__ import annotations

import os
import sys
import time

ENV = "HELIOS_START_TRACE"
PREFIX = "helios start trace:"


def mark(step: str) -> None:
    """Prints `step` with the wall-clock time and this process's id, where the trace is on (best effort)."""
    if os.environ.get(ENV, "") not in ("", "0"):
        try:
            print(f"{PREFIX} {time.time():.3f} pid {os.getpid()} {step}", file=sys.__stderr__, flush=True)
        except (OSError, ValueError, AttributeError):  # a stderr nobody reads, or none: the trace never fails the start
            pass

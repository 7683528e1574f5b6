"""``kill -USR1 PID`` prints every thread's Python stack of a long-running command to stderr.

`helios serve` and `helios rank` install it: a stuck server or rank can be diagnosed without
stopping it (the process keeps running after the dump). No-op where the platform has no SIGUSR1.
"""

from __future__ import annotations

import faulthandler
import signal
import sys


def dump_stacks_on_sigusr1() -> bool:
    """Registers the handler; returns whether it could (a platform without SIGUSR1, or no stderr
    with a file descriptor, as under a capturing test runner, cannot)."""
    if not hasattr(signal, "SIGUSR1"):
        return False
    for stream in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True, chain=False)
            return True
        except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is an OSError
            continue
    return False

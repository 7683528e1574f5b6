"""``kill -USR1 PID`` prints every thread's Python stack of a long-running command to stderr.

`helios serve` and `helios rank` install it: a stuck server or rank can be diagnosed without
stopping it (the process keeps running after the dump). No-op where the platform has no SIGUSR1.
"""

from __future__ import annotations

import faulthandler
import signal
import sys


def dump_stacks_on_sigusr1() -> bool:
    """Registers the handler; returns whether the platform has SIGUSR1."""
    if not hasattr(signal, "SIGUSR1"):
        return False
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    return True

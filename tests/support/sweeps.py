"""Which of the suite's sweeps run.

The default suite runs one representative of each behaviour it checks; a sweep adds the variants whose
code paths a default test already takes (more families on a path, more seeds, more tiles). Each sweep has
its own environment variable, and `HELIOS_FULL_SUITE=1` turns on every sweep gated here.
"""

from __future__ import annotations

import os

FULL_SUITE = "HELIOS_FULL_SUITE"


def swept(name: str) -> bool:
    """True when the sweep named by the environment variable `name` runs (`name=1` or the full suite)."""
    return os.environ.get(name) == "1" or os.environ.get(FULL_SUITE) == "1"


def in_sweep(name: str, always: tuple, swept_only: tuple) -> tuple:
    """`always`, then `swept_only` when the sweep `name` runs: the parameter list of a swept test."""
    return always + swept_only if swept(name) else always

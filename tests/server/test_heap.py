"""`freeze_startup_heap` (run by each serving process when it is ready): what exists then is frozen
out of the cyclic collector's traversals, and the collector still finds cycles made later.
`hold_freed_memory`: memory freed at the top of the heap is kept for the next allocations instead
of being handed back and faulted in again. Run in child interpreters, since both are process-wide."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHECK = """
import gc, weakref
from helios.server.heap import freeze_startup_heap

class Node:
    pass

startup = Node()
startup.self = startup  # a startup cycle: frozen, never collected
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() > 1000, frozen
assert gc.isenabled()
later = Node()
later.self = later
alive = weakref.ref(later)
del later
gc.collect()
assert alive() is None, "a cycle made after the freeze was not collected"
print("ok", frozen)
"""


def test_startup_objects_are_frozen_and_later_cycles_still_collected():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")


CHURN = """
import resource, sys
from helios.server.heap import hold_freed_memory

if sys.argv[1] == "held":
    assert hold_freed_memory()

def churn():  # a step's worth of large temporaries, allocated, written and freed
    blocks = [bytearray(8 << 20) for _ in range(4)]
    del blocks

churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_of_churn(mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_freed_memory_is_reused_without_page_faults():
    # glibc's own thresholds hand the 32 MiB back after each round and fault it in again (8,192
    # pages a round); held, the rounds after the first reuse it.
    assert faults_of_churn("plain") > 4 * 4096
    assert faults_of_churn("held") < 1024


def test_holding_freed_memory_changes_nothing_outside_glibc(monkeypatch):
    from helios.server import heap

    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("musl", "1.2"))
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda *_: pytest.fail("the C library was called"))
    assert heap.hold_freed_memory() is False

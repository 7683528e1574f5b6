"""`hold_freed_memory`: memory freed at the top of the heap is kept for the next allocations instead
of being handed back and faulted in again (run in child interpreters, since it is process-wide);
nothing changes outside glibc; `build_runtime` holds it unless its options say not to."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from helios.runtime import host_heap, service


CHURN = """
import resource, sys
from helios.runtime.host_heap import hold_freed_memory

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
    monkeypatch.setattr(host_heap.platform, "libc_ver", lambda: ("musl", "1.2"))
    monkeypatch.setattr(host_heap.ctypes, "CDLL", lambda *_: pytest.fail("the C library was called"))
    assert host_heap.hold_freed_memory() is False


@pytest.mark.parametrize("holds", [True, False])
def test_build_runtime_holds_freed_memory_unless_told_not_to(monkeypatch, holds):
    calls = []
    monkeypatch.setattr(service, "hold_freed_memory", lambda: calls.append(1) or True)

    class Refused(Exception):
        pass

    class Core:  # build_runtime reads the manifest after holding; stop it there
        @property
        def prepared(self):
            raise Refused

    with pytest.raises(Refused):
        service.build_runtime(Core(), service.RuntimeOptions(hold_freed_memory=holds))
    assert calls == ([1] if holds else [])

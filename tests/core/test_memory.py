"""Bounded memory: a 256 MiB resource is written and decoded without ever being held whole,
compressed or decoded (Python allocations traced; zstd's own window is capped at 8 MiB)."""

from __future__ import annotations

import hashlib
import io
import random
import tracemalloc

import pytest

from helios.core.reader import open_core

from .builders import NAMESPACE, new_writer

MiB = 1024 * 1024
TOTAL = 256 * MiB


class PseudoRandomStream(io.RawIOBase):
    """Incompressible bytes generated 1 MiB at a time; remembers their SHA-256."""

    def __init__(self, nbytes: int):
        self._left = nbytes
        self._random = random.Random(11)
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self._left, MiB)
        data = self._random.randbytes(count)
        buffer[:count] = data
        self.sha256.update(data)
        self._left -= count
        return count


def traced_peak(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_256_mib_resource_streams_in_bounded_memory(tmp_path, key):
    source = PseudoRandomStream(TOTAL)
    writer = new_writer([key], extra={"big": io.BufferedReader(source, MiB)})
    path = tmp_path / "big.core"
    write_peak = traced_peak(lambda: writer.write(path))
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    assert core.resource("big").stored_nbytes > TOTAL  # incompressible: stored frame > 256 MiB
    digest = hashlib.sha256()

    def decode():
        buffer = bytearray(MiB)
        with core.open_resource("big") as stream:
            while count := stream.readinto(buffer):
                digest.update(memoryview(buffer)[:count])

    read_peak = traced_peak(decode)
    assert digest.digest() == source.sha256.digest()
    assert write_peak < 24 * MiB
    assert read_peak < 24 * MiB

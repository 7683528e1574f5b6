"""A resource handed to the writer as consecutive buffers, never joined into one bytes object.

`Segments` lets a producer whose bytes already live in memory (a safetensors header followed by
the tensors' own storage) be compressed straight from that memory: the frame writer feeds each
buffer to the compressor in slices, with no read copy and no resource-sized allocation. The
buffers are borrowed, not owned: they must stay alive and unchanged until the core is written.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Iterator

SLICE_NBYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Segments:
    """Consecutive read-only byte buffers (anything `memoryview` accepts) forming one resource."""

    buffers: tuple

    @property
    def nbytes(self) -> int:
        return sum(memoryview(buffer).nbytes for buffer in self.buffers)

    def slices(self, slice_nbytes: int = SLICE_NBYTES) -> Iterator[memoryview]:
        """The bytes in order, as flat views of at most `slice_nbytes` each (empty buffers skipped)."""
        for buffer in self.buffers:
            view = memoryview(buffer).cast("B")
            for start in range(0, len(view), slice_nbytes):
                yield view[start:start + slice_nbytes]

    def to_bytes(self) -> bytes:
        """The whole resource as one bytes object (for tests and small resources)."""
        return b"".join(self.slices())


class SegmentsReader(io.RawIOBase):
    """A read-only stream over `Segments` (for writers that take a stream, e.g. sealed v4)."""

    def __init__(self, source: Segments):
        super().__init__()
        self._slices = source.slices()
        self._current = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._current:
            self._current = next(self._slices, None)
            if self._current is None:
                self._current = memoryview(b"")
                return 0
        view = memoryview(buffer).cast("B")
        count = min(len(view), len(self._current))
        view[:count] = self._current[:count]
        self._current = self._current[count:]
        return count

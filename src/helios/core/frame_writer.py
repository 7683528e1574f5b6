"""Encoding one resource as exactly one zstd level-3 frame, with chunk commitments.

`write_frame` streams a source (a binary stream, or `Segments` compressed straight from their
memory) through the compressor into a sink and digests the compressed bytes in 4 MiB chunks on
the way (each chunk hashed on a pool thread while compression goes on), so neither the resource
nor its frame is ever held whole. Both kinds of source give the same frame bytes for the same
content: zstd's output does not depend on how its input was cut.
Level 3 keeps the window at most 2 MiB (well under the 8 MiB reader cap); the frame carries its
content size when known and a content checksum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import zstandard

from helios.core.chunks import CHUNK_NBYTES, ParallelChunkDigester
from helios.core.segments import Segments

ZSTD_LEVEL = 3
_IO_NBYTES = 1024 * 1024


@dataclass(frozen=True)
class StoredFrame:
    """What a written frame commits to: its stored length, decoded length and chunk digests."""

    stored_nbytes: int
    decoded_nbytes: int
    chunk_sha256: tuple[bytes, ...]


class _DigestingSink:
    """Forwards writes to `sink` and digests them. Does not own `sink`."""

    def __init__(self, sink: BinaryIO, chunk_nbytes: int):
        self._sink = sink
        self.digester = ParallelChunkDigester(chunk_nbytes)

    def write(self, data) -> int:
        data = bytes(data)  # the digester holds it until its chunk is hashed
        self.digester.update(data)
        return self._sink.write(data)


_THREADED_NBYTES = 64 << 20


def write_frame(
    source: BinaryIO | Segments,
    sink: BinaryIO,
    *,
    size: int | None = None,
    chunk_nbytes: int = CHUNK_NBYTES,
) -> StoredFrame:
    """Appends one zstd level-3 frame of everything `source` yields to `sink`.

    `size`, when given, must be the exact number of bytes `source` yields; it is written into
    the frame header (`Segments` always know their size). Reads a stream to EOF; neither stream
    is closed.
    """
    if isinstance(source, Segments):
        size = source.nbytes if size is None else size
    # zstd's multi-threaded mode writes one standard frame whose bytes do not depend on how many
    # workers ran; it pays for large resources (weights) and is left off for small ones.
    threads = -1 if size is None or size >= _THREADED_NBYTES else 0
    compressor = zstandard.ZstdCompressor(
        level=ZSTD_LEVEL, write_checksum=True, write_content_size=size is not None, threads=threads
    )
    digesting = _DigestingSink(sink, chunk_nbytes)
    try:
        if isinstance(source, Segments):
            decoded, stored = _compress_segments(compressor, source, digesting, size)
        else:
            decoded, stored = compressor.copy_stream(
                source, digesting, size=-1 if size is None else size,
                read_size=_IO_NBYTES, write_size=_IO_NBYTES,
            )
    except BaseException:
        digesting.digester.close()
        raise
    if size is not None and decoded != size:
        digesting.digester.close()
        raise ValueError(f"the source yielded {decoded} bytes, not the announced {size}")
    return StoredFrame(stored, decoded, digesting.digester.finish())


def _compress_segments(compressor, source: Segments, sink: _DigestingSink, size: int) -> tuple[int, int]:
    """Feeds the buffers to the compressor without copying them first; (decoded, stored) counts."""
    writer = compressor.stream_writer(sink, size=size, write_size=_IO_NBYTES, closefd=False)
    decoded = 0
    for piece in source.slices():
        writer.write(piece)
        decoded += len(piece)
    writer.flush(zstandard.FLUSH_FRAME)
    return decoded, sink.digester.nbytes

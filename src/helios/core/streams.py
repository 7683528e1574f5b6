"""Opening the stored bytes of one resource as a verified, decoded binary stream.

Shared by `Core` (verified cores) and by the commands that copy stored bytes (`relocate`,
`sign`), so every path that touches stored bytes goes through the same checks.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

from helios.core.aead import AeadChunkReader
from helios.core.chunks import RangeFile, VerifiedChunks
from helios.core.errors import DecodedLengthError, MissingAeadKeyError, ResourceTooLargeError
from helios.core.frame_reader import FrameReader
from helios.core.records import Placement, ResourceEntry

STREAM_BUFFER_NBYTES = 1024 * 1024


def open_decoded(
    path: Path,
    placement: Placement,
    entry: ResourceEntry,
    *,
    is_sealed: bool,
    aes_key: bytes | None,
) -> BinaryIO:
    """A buffered stream of the resource's decoded bytes; the caller closes it.

    Errors (typed, from `helios.core.errors`) surface from `read`; read to EOF for the final
    length and structure checks.
    """
    if is_sealed and aes_key is None:
        raise MissingAeadKeyError("a version 4 core needs the operator's AES key to read resources")
    source = RangeFile.open(path, placement.offset, placement.nbytes)
    try:
        if is_sealed:
            raw: io.RawIOBase = AeadChunkReader(
                source,
                key=aes_key,
                resource_id=entry.id,
                decoded_nbytes=entry.info.decoded_nbytes,
                nonce_prefix=entry.nonce_prefix,
            )
        else:
            chunks = VerifiedChunks(source, entry.chunk_sha256, entry.id, entry.chunk_nbytes)
            raw = FrameReader(chunks, entry.info.decoded_nbytes, on_close=source.close)
    except BaseException:
        source.close()
        raise
    return io.BufferedReader(raw, STREAM_BUFFER_NBYTES)


def available_memory_nbytes() -> int | None:
    """Memory the kernel says is available to new allocations (Linux ``MemAvailable``); None
    where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits_memory(what: str, nbytes: int) -> None:
    """`ResourceTooLargeError` when `nbytes` exceed the memory available now."""
    available = available_memory_nbytes()
    if available is not None and nbytes > available:
        raise ResourceTooLargeError(f"{what} decodes to {nbytes} bytes; only {available} bytes of memory are available")


def read_decoded(stream: BinaryIO, decoded_nbytes: int, what: str = "the resource") -> bytes:
    """All of `stream` (which must decode to `decoded_nbytes`), read to EOF so checks run. The
    length is checked against available memory before the one allocation."""
    check_fits_memory(what, decoded_nbytes)
    data = stream.read(decoded_nbytes)  # one allocation; the buffered reader fills it in place
    # One more read reaches EOF, where the length and end-of-frame checks run (or a bomb fails).
    if stream.read(1) or len(data) != decoded_nbytes:
        raise DecodedLengthError("the resource does not decode to its signed length")
    return data


def read_exact_into(stream: BinaryIO, buffer) -> None:
    """Fills the writable `buffer` from `stream` (decoding straight into its memory: a buffered
    stream hands reads this large to the frame reader unbuffered); DecodedLengthError if the
    stream ends first. Call `expect_end` after the last read so the final checks run."""
    view = memoryview(buffer).cast("B")
    while view:
        count = stream.readinto(view)
        if not count:
            raise DecodedLengthError("the resource decodes to fewer bytes than its contents need")
        view = view[count:]


def expect_end(stream: BinaryIO) -> None:
    """Reads `stream` to EOF, where the length and end-of-frame checks run; DecodedLengthError if
    decoded bytes are left over."""
    if stream.read(1):
        raise DecodedLengthError("the resource decodes to more bytes than its contents use")


def drain_decoded(stream: BinaryIO, block_nbytes: int = 4 * STREAM_BUFFER_NBYTES) -> int:
    """Reads `stream` to EOF (running every check) and returns the decoded byte count."""
    buffer = bytearray(block_nbytes)
    total = 0
    while count := stream.readinto(buffer):
        total += count
    return total


def copy_stored(path: Path, placement: Placement, entry: ResourceEntry, sink: BinaryIO) -> None:
    """Copies the stored bytes verbatim to `sink`, checking chunk digests (zstd resources)."""
    source = RangeFile.open(path, placement.offset, placement.nbytes)
    try:
        if entry.chunk_sha256:
            chunks = VerifiedChunks(source, entry.chunk_sha256, entry.id, entry.chunk_nbytes)
            try:
                while (chunk := chunks.next_chunk()) is not None:
                    sink.write(chunk)
            finally:
                chunks.close()
        else:
            for start in range(0, placement.nbytes, STREAM_BUFFER_NBYTES * 4):
                nbytes = min(STREAM_BUFFER_NBYTES * 4, placement.nbytes - start)
                sink.write(source.read_at(start, nbytes))
    finally:
        source.close()

"""Fixed-size chunk commitments over stored (compressed) bytes.

A stored frame of `n` bytes is committed to by ceil(n / chunk_nbytes) SHA-256 digests, one per
consecutive chunk (the last may be short). `ChunkDigester` computes them while bytes are written;
`VerifiedChunks` reads a stored range back one chunk at a time and releases a chunk only after its
digest matched, so a consumer never sees a byte that is not committed to.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from helios.core.errors import ChunkDigestError, LocationError

CHUNK_NBYTES = 4 * 1024 * 1024


def chunk_count(stored_nbytes: int, chunk_nbytes: int = CHUNK_NBYTES) -> int:
    """ceil(stored_nbytes / chunk_nbytes)."""
    return -(-stored_nbytes // chunk_nbytes)


class ChunkDigester:
    """Digests of consecutive `chunk_nbytes` chunks of everything passed to `update`. Mutable."""

    def __init__(self, chunk_nbytes: int = CHUNK_NBYTES):
        self._chunk_nbytes = chunk_nbytes
        self._digests: list[bytes] = []
        self._current = hashlib.sha256()
        self._filled = 0
        self.nbytes = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            take = min(self._chunk_nbytes - self._filled, len(view))
            self._current.update(view[:take])
            self._filled += take
            self.nbytes += take
            view = view[take:]
            if self._filled == self._chunk_nbytes:
                self._digests.append(self._current.digest())
                self._current = hashlib.sha256()
                self._filled = 0

    def finish(self) -> tuple[bytes, ...]:
        """All digests, including the short last chunk. Call once, after the last update."""
        if self._filled:
            self._digests.append(self._current.digest())
            self._filled = 0
        return tuple(self._digests)


def _digest_pieces(pieces: list) -> bytes:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.digest()


class ParallelChunkDigester:
    """`ChunkDigester`'s digests, each chunk hashed on the process-wide chunk pool.

    `update` keeps references to the pieces it is given (they must not change afterwards: pass
    bytes) until their chunk is hashed; at most `in_flight` full chunks wait for a worker, so
    memory stays bounded. A worker's error is raised by `update` or `finish`; `finish` (or
    `close`, on an error path) leaves no task behind. Mutable; owned by one writer.
    """

    def __init__(self, chunk_nbytes: int = CHUNK_NBYTES, *, in_flight: int = 2):
        self._chunk_nbytes = chunk_nbytes
        self._in_flight = in_flight
        self._pieces: list = []
        self._filled = 0
        self._futures: deque[Future] = deque()
        self._digests: list[bytes] = []
        self.nbytes = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            take = min(self._chunk_nbytes - self._filled, len(view))
            self._pieces.append(view[:take])
            self._filled += take
            self.nbytes += take
            view = view[take:]
            if self._filled == self._chunk_nbytes:
                self._submit()

    def _submit(self) -> None:
        pieces, self._pieces, self._filled = self._pieces, [], 0
        self._futures.append(_read_ahead_pool().submit(_digest_pieces, pieces))
        while len(self._futures) > self._in_flight:
            self._digests.append(self._futures.popleft().result())

    def finish(self) -> tuple[bytes, ...]:
        """All digests, including the short last chunk. Call once, after the last update."""
        if self._filled:
            self._submit()
        try:
            while self._futures:
                self._digests.append(self._futures.popleft().result())
        finally:
            self.close()
        return tuple(self._digests)

    def close(self) -> None:
        """Cancels or waits for every pending hash (an error path leaves no task behind)."""
        futures, self._futures = self._futures, deque()
        for future in futures:
            if not future.cancel():
                future.exception()


class RangeFile:
    """Positional reads from `[offset, offset + nbytes)` of an open file descriptor.

    Owns the descriptor: `close()` closes it. `os.pread` keeps reads independent of any shared
    file position.
    """

    def __init__(self, fd: int, offset: int, nbytes: int, name: str):
        self.fd, self.offset, self.nbytes, self.name = fd, offset, nbytes, name

    @classmethod
    def open(cls, path: os.PathLike | str, offset: int, nbytes: int) -> "RangeFile":
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as error:
            raise LocationError(f"cannot open {path}: {error.strerror}") from None
        return cls(fd, offset, nbytes, str(path))

    def read_at(self, position: int, nbytes: int) -> bytes:
        """Exactly `nbytes` from `position` within the range; a short or unreadable file is a
        LocationError."""
        try:
            data = os.pread(self.fd, nbytes, self.offset + position)
        except OSError as error:  # EIO, or a part replaced by a directory after it was placed
            raise LocationError(f"cannot read {self.name}: {error.strerror}") from None
        if len(data) != nbytes:
            raise LocationError(f"{self.name} ends before the stored range it must hold")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_READ_AHEAD: ThreadPoolExecutor | None = None
_READ_AHEAD_LOCK = threading.Lock()
READ_AHEAD_CHUNKS = 2  # chunks in flight per reader: 3 chunks (12 MiB) held at most


def read_ahead_workers() -> int:
    """Threads of the process-wide chunk pool: enough for several readers' read-ahead."""
    return max(4, min(16, os.cpu_count() or 4))


def _read_ahead_pool() -> ThreadPoolExecutor:
    """One process-wide pool, created once and never shut down (its threads are reused, so
    failing readers leak none): chunk reads and SHA-256 release the GIL, so reading and hashing
    chunks i + 1 .. i + depth overlaps decoding chunk i."""
    global _READ_AHEAD
    with _READ_AHEAD_LOCK:
        if _READ_AHEAD is None:
            _READ_AHEAD = ThreadPoolExecutor(read_ahead_workers(), thread_name_prefix="helios-chunks")
        return _READ_AHEAD


class VerifiedChunks:
    """Yields the stored bytes of one resource chunk by chunk, each verified before release.

    With `read_ahead` N > 0, the next N chunks are read and verified on pool threads while the
    caller works on the current one: at most N + 1 chunks are held, and a chunk is still released
    only after its digest matched. A worker's error (a `ChunkDigestError`, a short file) is raised
    by `next_chunk` for that chunk, in order, exactly as without read-ahead. Mutable cursor; owned
    by one reader; does not own `source`, but `close()` must run before `source` is closed (it
    cancels or waits for every in-flight read).
    """

    def __init__(
        self,
        source: RangeFile,
        digests: Sequence[bytes],
        resource_id: str,
        chunk_nbytes: int = CHUNK_NBYTES,
        *,
        read_ahead: int = READ_AHEAD_CHUNKS,
    ):
        if len(digests) != chunk_count(source.nbytes, chunk_nbytes):
            raise LocationError(f"resource {resource_id!r}: chunk count does not fit its length")
        if read_ahead < 0:
            raise ValueError("read_ahead must be non-negative")
        self._source = source
        self._digests = digests
        self._resource_id = resource_id
        self._chunk_nbytes = chunk_nbytes
        self._read_ahead = int(read_ahead)
        self._index = 0
        self._pending: deque[Future] = deque()  # chunks _index, _index + 1, ... in order

    @property
    def chunk_nbytes(self) -> int:
        return self._chunk_nbytes

    @property
    def is_exhausted(self) -> bool:
        return self._index == len(self._digests)

    def _load(self, index: int) -> bytes:
        start = index * self._chunk_nbytes
        nbytes = min(self._chunk_nbytes, self._source.nbytes - start)
        data = self._source.read_at(start, nbytes)
        if hashlib.sha256(data).digest() != self._digests[index]:
            raise ChunkDigestError(
                f"resource {self._resource_id!r}: chunk {index} does not match its digest"
            )
        return data

    def _top_up(self) -> None:
        requested = self._index + len(self._pending)
        stop = min(len(self._digests), self._index + 1 + self._read_ahead)
        for index in range(requested, stop):
            self._pending.append(_read_ahead_pool().submit(self._load, index))

    def next_chunk(self) -> bytes | None:
        """The next verified chunk, or None after the last one."""
        if self.is_exhausted:
            return None
        if self._read_ahead:
            self._top_up()
            data = self._pending.popleft().result()
        else:
            data = self._load(self._index)
        self._index += 1
        if self._read_ahead:
            self._top_up()
        return data

    def close(self) -> None:
        """Cancels (or waits for and discards) every in-flight read-ahead."""
        pending, self._pending = self._pending, deque()
        for future in pending:
            future.cancel()
        for future in pending:
            if not future.cancelled():
                future.exception()

"""Streaming, verified decode of one stored zstd frame.

Pipeline, per 4 MiB chunk: read from the file -> SHA-256 against the signed digest ->
`FrameWalker` (structure, window cap, trailing bytes) -> decompressor input. The decompressor is
created only after the frame header passed the walker, with `max_window_size` as a second guard.

Memory is bounded by one stored chunk, the decoder window (at most 8 MiB) and the caller's read
buffer; a resource is never held whole, compressed or decoded. Output is produced in bounded
reads and counted: a frame decoding past its signed length (a decompression bomb) fails on the
first byte beyond it, and a short one fails at its end. A reader must be read to EOF for the
final checks (length, truncation, content checksum) to run; `read_resource` does so.
"""

from __future__ import annotations

import io

import zstandard

from helios.core.chunks import VerifiedChunks
from helios.core.errors import DecodedLengthError, FrameError, WindowTooLargeError
from helios.core.zstd_frame import MAX_WINDOW_NBYTES, FrameWalker


class _VerifiedInput:
    """The decompressor's `read(size)` source: verified, walked chunks in order. Mutable."""

    def __init__(self, chunks: VerifiedChunks, walker: FrameWalker):
        self.chunk_nbytes = chunks.chunk_nbytes
        self._chunks = chunks
        self._walker = walker
        self._buffer = memoryview(b"")

    def pull(self) -> bool:
        """Loads the next chunk (verified, then walked); False when the stored bytes ended."""
        chunk = self._chunks.next_chunk()
        if chunk is None:
            self._walker.finish()
            return False
        self._walker.feed(chunk)
        self._buffer = memoryview(chunk)
        return True

    def prime(self) -> None:
        """Pulls chunks until the frame header is complete (and so checked by the walker)."""
        pending = []
        while self._walker.header is None:
            chunk = self._chunks.next_chunk()
            if chunk is None:
                self._walker.finish()  # raises: the stored bytes end inside the header
            self._walker.feed(chunk)
            pending.append(chunk)
        self._buffer = memoryview(pending[0] if len(pending) == 1 else b"".join(pending))

    def read(self, size: int = -1) -> memoryview:
        if not self._buffer and not self.pull():
            return memoryview(b"")
        size = len(self._buffer) if size < 0 else size
        piece, self._buffer = self._buffer[:size], self._buffer[size:]
        return piece

    def close(self) -> None:
        self._chunks.close()

    def drain(self) -> None:
        """Runs every remaining chunk through verification and the walker, then finishes it."""
        self._buffer = memoryview(b"")
        while self.pull():
            self._buffer = memoryview(b"")


class FrameReader(io.RawIOBase):
    """A read-only binary stream of one resource's decoded bytes, verified while it streams.

    Owns `source` (the file range) and closes it on `close()`. Raises the typed errors of
    `helios.core.errors` from `readinto`; after an error the stream is unusable.
    """

    def __init__(
        self,
        chunks: VerifiedChunks,
        decoded_nbytes: int,
        *,
        on_close=None,
        max_window_nbytes: int = MAX_WINDOW_NBYTES,
    ):
        super().__init__()
        self._walker = FrameWalker(decoded_nbytes, max_window_nbytes)
        self._input = _VerifiedInput(chunks, self._walker)
        self._decoded_nbytes = decoded_nbytes
        self._max_window = max_window_nbytes
        self._produced = 0
        self._decoder = None
        self._at_eof = False
        self._on_close = on_close

    def readable(self) -> bool:
        return True

    def _start(self) -> None:
        # The first chunk is verified and its frame header checked (window cap included)
        # before the decompressor, and with it any window buffer, exists.
        self._input.prime()
        decompressor = zstandard.ZstdDecompressor(max_window_size=self._max_window)
        # Whole chunks in: each input read is a call into Python (the GIL), so a reader decoding
        # beside other threads (load decodes weight parts side by side while programs deserialize)
        # takes the GIL once per stored chunk rather than once per slice of one.
        self._decoder = decompressor.stream_reader(
            self._input, read_size=self._input.chunk_nbytes, read_across_frames=False, closefd=False
        )

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        if self._at_eof or not view:
            return 0
        if self._decoder is None:
            self._start()
        remaining = self._decoded_nbytes - self._produced
        # Ask for at most one byte beyond the signed length: enough to detect a bomb.
        try:
            count = self._decoder.readinto(view[: min(len(view), remaining + 1)])
        except zstandard.ZstdError as error:
            raise _decoder_error(error) from None
        if count > remaining:
            raise DecodedLengthError(
                f"the frame decodes past its signed length of {self._decoded_nbytes} bytes"
            )
        self._produced += count
        if count == 0:
            self._finish()
        return count

    def _finish(self) -> None:
        self._at_eof = True
        self._input.drain()
        if self._produced != self._decoded_nbytes:
            raise DecodedLengthError(
                f"the frame decodes to {self._produced} bytes; "
                f"the signed length is {self._decoded_nbytes}"
            )

    def close(self) -> None:
        if not self.closed:
            if self._decoder is not None:
                self._decoder.close()
            self._input.close()
            if self._on_close is not None:
                self._on_close()
        super().close()


def _decoder_error(error: zstandard.ZstdError) -> FrameError:
    text = str(error)
    if "too much memory" in text or "window" in text.lower():
        return WindowTooLargeError(f"zstd refused the frame's window: {text}")
    return FrameError(f"the zstd frame does not decode: {text}")

"""Structural check of exactly one zstd frame, fed incrementally.

`FrameWalker` follows the zstd frame format (RFC 8878): the frame header, then block headers and
their sizes, then the optional content checksum. It never decompresses. It exists so that every
structural rule is checked on verified compressed bytes *before* they reach the decompressor:

- the first four bytes are the zstd magic (a skippable frame is rejected);
- the window the header asks for is at most `max_window_nbytes` (checked from the header alone,
  before any decoder state is allocated), and no dictionary is used;
- a declared frame content size equals the signed decoded length;
- the frame ends exactly where the stored bytes end: no truncation, extra frame or trailing bytes.

The walker is a small mutable state machine owned by one reader; it holds at most 18 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.core.errors import (
    DecodedLengthError,
    ExtraFrameError,
    FrameError,
    SkippableFrameError,
    TrailingBytesError,
    TruncatedFrameError,
    WindowTooLargeError,
)

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SKIPPABLE_MAGIC_MASK = 0xFFFFFFF0
SKIPPABLE_MAGIC = 0x184D2A50
MAX_BLOCK_NBYTES = 128 * 1024
MAX_WINDOW_NBYTES = 8 * 1024 * 1024
MIN_BLOCK_WITH_OUTPUT_NBYTES = 4  # a block header (3 bytes) and one byte of an RLE block

_FCS_NBYTES = (0, 2, 4, 8)
_DID_NBYTES = (0, 1, 2, 4)
_HEADER, _BLOCK_HEADER, _BLOCK_BODY, _CHECKSUM, _DONE = range(5)


@dataclass(frozen=True)
class FrameHeader:
    """The parts of a zstd frame header that decide how (and whether) it may be decoded."""

    header_nbytes: int
    window_nbytes: int
    content_nbytes: int | None
    has_checksum: bool
    dictionary_id: int


def _check_magic(head: bytes) -> None:
    magic = int.from_bytes(head[:4], "little")
    if magic & SKIPPABLE_MAGIC_MASK == SKIPPABLE_MAGIC:
        raise SkippableFrameError("a skippable frame stands where the resource frame must be")
    if head[:4] != ZSTD_MAGIC:
        raise FrameError("the stored bytes do not start with a zstd frame")


def header_nbytes(descriptor: int) -> int:
    """Total header length (magic included) implied by the frame header descriptor byte."""
    fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
    fcs = _FCS_NBYTES[fcs_flag] or (1 if single_segment else 0)
    return 5 + (0 if single_segment else 1) + _DID_NBYTES[descriptor & 3] + fcs


def parse_frame_header(head: bytes) -> FrameHeader:
    """Parses a complete frame header (`len(head) == header_nbytes(head[4])`)."""
    _check_magic(head)
    descriptor = head[4]
    if descriptor & 0x08:
        raise FrameError("the frame header's reserved bit is set")
    single_segment = (descriptor >> 5) & 1
    pos = 5
    window = 0
    if not single_segment:
        exponent, mantissa = head[pos] >> 3, head[pos] & 7
        base = 1 << (10 + exponent)
        window = base + (base >> 3) * mantissa
        pos += 1
    did_nbytes = _DID_NBYTES[descriptor & 3]
    dictionary_id = int.from_bytes(head[pos : pos + did_nbytes], "little")
    pos += did_nbytes
    fcs_nbytes = len(head) - pos
    content = int.from_bytes(head[pos:], "little") if fcs_nbytes else None
    if fcs_nbytes == 2:
        content += 256
    if single_segment:
        window = content
    return FrameHeader(len(head), window, content, bool(descriptor & 0x04), dictionary_id)


def _trailing_error(extra: bytes) -> FrameError:
    if len(extra) >= 4:
        magic = int.from_bytes(extra[:4], "little")
        if magic & SKIPPABLE_MAGIC_MASK == SKIPPABLE_MAGIC:
            return SkippableFrameError("a skippable frame follows the resource frame")
        if extra[:4] == ZSTD_MAGIC:
            return ExtraFrameError("another zstd frame follows the resource frame")
    return TrailingBytesError("bytes follow the end of the resource frame")


class FrameWalker:
    """Feeds on the stored bytes of one resource and raises as soon as they break a frame rule.

    `feed(data)` for each piece in order, then `finish()` once the stored bytes end. Mutable;
    not thread-safe; owned by exactly one reader.
    """

    def __init__(self, decoded_nbytes: int, max_window_nbytes: int = MAX_WINDOW_NBYTES):
        self._decoded_nbytes = decoded_nbytes
        self._max_window = max_window_nbytes
        self._state = _HEADER
        self._pending = bytearray()
        self._skip = 0
        self._last_block = False
        self._block_max = MAX_BLOCK_NBYTES
        self.header: FrameHeader | None = None

    @property
    def is_complete(self) -> bool:
        return self._state == _DONE

    def _need(self) -> int:
        if self._state == _HEADER:
            return 5 if len(self._pending) < 5 else header_nbytes(self._pending[4])
        return 3 if self._state == _BLOCK_HEADER else 4

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            if self._state == _BLOCK_BODY:
                take = min(self._skip, end - pos)
                pos += take
                self._skip -= take
                if self._skip == 0:
                    self._after_block()
            elif self._state == _DONE:
                self._pending += view[pos : pos + 4 - len(self._pending)]
                if len(self._pending) >= 4:
                    raise _trailing_error(bytes(self._pending))
                return
            else:
                take = min(self._need() - len(self._pending), end - pos)
                self._pending += view[pos : pos + take]
                pos += take
                if len(self._pending) == self._need():
                    self._complete_field()

    def finish(self) -> None:
        """Raises unless exactly one complete frame was fed."""
        if self._state == _DONE and self._pending:
            raise _trailing_error(bytes(self._pending))
        if self._state != _DONE:
            raise TruncatedFrameError("the stored bytes end inside the zstd frame")

    def _complete_field(self) -> None:
        if self._state == _HEADER and len(self._pending) == 5:
            _check_magic(self._pending)  # the full header length is known from now on
            return
        field = bytes(self._pending)
        self._pending.clear()
        if self._state == _HEADER:
            self._accept_header(parse_frame_header(field))
        elif self._state == _BLOCK_HEADER:
            self._accept_block_header(int.from_bytes(field, "little"))
        else:
            self._state = _DONE

    def _accept_header(self, header: FrameHeader) -> None:
        if header.window_nbytes > self._max_window:
            raise WindowTooLargeError(
                f"the frame asks for a {header.window_nbytes}-byte window; "
                f"the cap is {self._max_window} bytes"
            )
        if header.dictionary_id:
            raise FrameError("the frame names a dictionary; resources are dictionary-free")
        if header.content_nbytes is not None and header.content_nbytes != self._decoded_nbytes:
            raise DecodedLengthError(
                f"the frame declares {header.content_nbytes} decoded bytes; "
                f"the signed length is {self._decoded_nbytes}"
            )
        self.header = header
        self._block_max = min(header.window_nbytes, MAX_BLOCK_NBYTES)
        self._state = _BLOCK_HEADER

    def _accept_block_header(self, value: int) -> None:
        self._last_block = bool(value & 1)
        block_type, block_nbytes = (value >> 1) & 3, value >> 3
        if block_type == 3:
            raise FrameError("a zstd block has the reserved block type")
        if block_nbytes > self._block_max:
            raise FrameError(f"a zstd block of {block_nbytes} bytes exceeds {self._block_max}")
        self._skip = 1 if block_type == 1 else block_nbytes
        self._state = _BLOCK_BODY
        if self._skip == 0:
            self._after_block()

    def _after_block(self) -> None:
        if not self._last_block:
            self._state = _BLOCK_HEADER
        elif self.header is not None and self.header.has_checksum:
            self._state = _CHECKSUM
        else:
            self._state = _DONE


def max_decoded_nbytes(stored_nbytes: int) -> int:
    """The most bytes any zstd frame of `stored_nbytes` can decode to: each block that produces
    output takes at least `MIN_BLOCK_WITH_OUTPUT_NBYTES` stored bytes and produces at most
    `MAX_BLOCK_NBYTES` (an RLE block: about 32,768 to 1)."""
    return (stored_nbytes // MIN_BLOCK_WITH_OUTPUT_NBYTES) * MAX_BLOCK_NBYTES

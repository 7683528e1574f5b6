"""The structural frame check: window cap from the header alone, one frame exactly, no tricks."""

from __future__ import annotations

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from helios.core.errors import (
    DecodedLengthError,
    ExtraFrameError,
    FrameError,
    SkippableFrameError,
    TrailingBytesError,
    TruncatedFrameError,
    WindowTooLargeError,
)
from helios.core.zstd_frame import MAX_WINDOW_NBYTES, FrameWalker, header_nbytes, parse_frame_header

from .builders import random_bytes, raw_block_frame, zstd_frame

SKIPPABLE = (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"skip"


def walk(frame: bytes, decoded_nbytes: int, piece: int | None = None) -> FrameWalker:
    walker = FrameWalker(decoded_nbytes)
    piece = piece or max(1, len(frame))
    for start in range(0, len(frame), piece):
        walker.feed(frame[start : start + piece])
    walker.finish()
    return walker


def test_level3_frames_fit_the_window_cap_and_declare_their_size():
    data = random_bytes(3 << 20) + bytes(3 << 20)
    walker = walk(zstd_frame(data), len(data))
    assert walker.header.window_nbytes <= 2 << 20
    assert walker.header.content_nbytes == len(data)
    assert walker.header.has_checksum


def test_two_gib_window_is_rejected_from_the_header_alone():
    header = b"\x28\xb5\x2f\xfd\x00" + bytes([21 << 3])  # window 2**31
    assert header_nbytes(header[4]) == len(header)
    assert parse_frame_header(header).window_nbytes == 2**31
    walker = FrameWalker(5)
    with pytest.raises(WindowTooLargeError):
        walker.feed(header)  # no block has been seen: the decision needs nothing more


def test_window_just_above_the_cap_is_rejected_and_at_the_cap_accepted():
    at_cap = raw_block_frame(b"hello", window_exponent=13)  # 8 MiB
    assert parse_frame_header(at_cap[:6]).window_nbytes == MAX_WINDOW_NBYTES
    walk(at_cap, 5)
    above = at_cap[:5] + bytes([13 << 3 | 1]) + at_cap[6:]  # 8 MiB + 1 MiB
    with pytest.raises(WindowTooLargeError):
        walk(above, 5)


def test_real_frame_with_a_16_mib_window_is_rejected():
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    chunks = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = chunks.compress(random_bytes(1 << 16) * 2) + chunks.flush()  # content size unknown
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 24
    with pytest.raises(WindowTooLargeError):
        walk(frame, 1 << 17)


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda f: SKIPPABLE + f, SkippableFrameError),
        (lambda f: f + SKIPPABLE, SkippableFrameError),
        (lambda f: f + f, ExtraFrameError),
        (lambda f: f + b"garbage", TrailingBytesError),
        (lambda f: f + b"\x00", TrailingBytesError),
        (lambda f: b"PK\x03\x04" + f, FrameError),
    ],
    ids=["skippable-first", "skippable-after", "extra-frame", "trailing", "one-byte", "not-zstd"],
)
def test_anything_but_one_frame_is_rejected(make, error):
    data = b"payload " * 100
    with pytest.raises(error):
        walk(make(zstd_frame(data)), len(data))


def test_every_truncation_is_rejected():
    data = random_bytes(1000) + bytes(5000)
    frame = zstd_frame(data)
    for end in range(len(frame)):
        with pytest.raises((TruncatedFrameError, DecodedLengthError)):
            walk(frame[:end], len(data))


def test_declared_content_size_must_equal_the_signed_length():
    frame = zstd_frame(b"x" * 100)
    with pytest.raises(DecodedLengthError):
        walk(frame, 99)


def test_reserved_bits_dictionaries_and_block_types_are_rejected():
    good = raw_block_frame(b"abc")
    with pytest.raises(FrameError):
        walk(good[:4] + bytes([good[4] | 0x08]) + good[5:], 3)  # reserved descriptor bit
    with_dict = good[:4] + b"\x01" + good[5:6] + b"\x07" + good[6:]
    with pytest.raises(FrameError):
        walk(with_dict, 3)
    reserved_block = good[:6] + (3 << 3 | 3 << 1 | 1).to_bytes(3, "little") + b"abc"
    with pytest.raises(FrameError):
        walk(reserved_block, 3)
    oversized = raw_block_frame(b"", window_exponent=0)[:6] + ((2048 << 3) | 1).to_bytes(3, "little")
    with pytest.raises(FrameError):
        walk(oversized + bytes(2048), 2048)  # a block larger than the 1 KiB window


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 300_000), piece=st.integers(1, 70_000), seed=st.integers(0, 9))
def test_feeding_in_any_pieces_gives_the_same_verdict(size, piece, seed):
    data = random_bytes(size // 2, seed) + bytes(size - size // 2)
    frame = zstd_frame(data, with_size=seed % 2 == 0)
    assert walk(frame, size, piece).is_complete
    with pytest.raises(TrailingBytesError):
        walk(frame + b"\x01\x02\x03\x04\x05", size, piece)

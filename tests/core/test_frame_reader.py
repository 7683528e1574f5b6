"""Streaming verified decode: chunks checked before decoding, lengths enforced, memory bounded."""

from __future__ import annotations

import io
import tracemalloc

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from helios.core import frame_reader
from helios.core.chunks import ChunkDigester, RangeFile, VerifiedChunks, chunk_count
from helios.core.errors import (
    ChunkDigestError,
    DecodedLengthError,
    FrameError,
    LocationError,
    WindowTooLargeError,
)
from helios.core.frame_reader import FrameReader

from .builders import random_bytes, raw_frame_of_stored_size, zstd_frame


def stored_reader(tmp_path, stored: bytes, decoded_nbytes: int, chunk_nbytes: int, *,
                  digests=None) -> io.BufferedReader:
    path = tmp_path / "stored.bin"
    path.write_bytes(b"prefix" + stored)
    if digests is None:
        digester = ChunkDigester(chunk_nbytes)
        digester.update(stored)
        digests = digester.finish()
    source = RangeFile.open(path, 6, len(stored))
    chunks = VerifiedChunks(source, digests, "r", chunk_nbytes)
    return io.BufferedReader(FrameReader(chunks, decoded_nbytes, on_close=source.close))


def read_in_pieces(stream, piece: int) -> bytes:
    out = bytearray()
    while data := stream.read(piece):
        out += data
    return bytes(out)


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.integers(1, 70_000),
    piece=st.integers(1, 100_000),
    seed=st.integers(0, 5),
    data=st.data(),
)
def test_decodes_any_size_in_any_chunking_and_read_size(tmp_path_factory, chunk, piece, seed, data):
    # Sizes stay within a few thousand chunks and reads so the test stays fast.
    size = data.draw(st.integers(0, min(200_000, 2000 * chunk, 2000 * piece)))
    content = random_bytes(size // 3, seed) + bytes(size - size // 3)
    frame = zstd_frame(content, with_size=seed % 2 == 0)
    with stored_reader(tmp_path_factory.mktemp("r"), frame, size, chunk) as stream:
        assert read_in_pieces(stream, piece) == content


@settings(max_examples=20, deadline=None)
@given(chunks=st.integers(1, 12), chunk=st.sampled_from([16, 100, 4096, 65536]))
def test_stored_length_an_exact_multiple_of_the_chunk(tmp_path_factory, chunks, chunk):
    frame, data = raw_frame_of_stored_size(chunks * chunk)
    assert len(frame) % chunk == 0
    assert chunk_count(len(frame), chunk) == len(frame) // chunk
    with stored_reader(tmp_path_factory.mktemp("m"), frame, len(data), chunk) as stream:
        assert stream.read() == data


def test_decompression_bomb_stops_one_byte_past_the_signed_length(tmp_path):
    bomb = zstd_frame(bytes(256 << 20), with_size=False)  # 256 MiB of zeros, ~8 KiB stored
    assert len(bomb) < 64 << 10
    tracemalloc.start()
    try:
        with stored_reader(tmp_path, bomb, 1000, 4 << 20) as stream:
            with pytest.raises(DecodedLengthError):
                read_in_pieces(stream, 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_frame_shorter_than_its_signed_length_fails_at_the_end(tmp_path):
    data = random_bytes(5000)
    with stored_reader(tmp_path, zstd_frame(data, with_size=False), 5001, 1024) as stream:
        with pytest.raises(DecodedLengthError):
            stream.read()


def test_corrupt_chunk_is_never_decoded(tmp_path):
    data = random_bytes(40_000)
    frame = bytearray(zstd_frame(data))
    chunk = 8192
    frame[3 * chunk + 10] ^= 0x40  # chunk 3 of 5
    digester = ChunkDigester(chunk)
    digester.update(zstd_frame(data))
    handed_on = bytearray()
    with stored_reader(tmp_path, bytes(frame), len(data), chunk, digests=digester.finish()) as s:
        with pytest.raises(ChunkDigestError):
            while piece := s.read(1000):
                handed_on += piece
    assert len(handed_on) < 3 * chunk  # nothing decoded from chunk 3 onward
    assert data.startswith(bytes(handed_on))


def test_valid_digests_over_a_broken_frame_still_fail(tmp_path):
    data = b"compressible text " * 2000
    frame = bytearray(zstd_frame(data))
    frame[-2] ^= 0xFF  # the content checksum
    with stored_reader(tmp_path, bytes(frame), len(data), 4096) as stream:
        with pytest.raises(FrameError):
            stream.read()


def test_window_is_checked_before_a_decompressor_exists(tmp_path, monkeypatch):
    def no_decompressor(*args, **kwargs):
        raise AssertionError("a decompressor was created for a rejected frame")

    monkeypatch.setattr(frame_reader.zstandard, "ZstdDecompressor", no_decompressor)
    header = b"\x28\xb5\x2f\xfd\x00" + bytes([21 << 3]) + (5 << 3 | 1).to_bytes(3, "little")
    with stored_reader(tmp_path, header + b"hello", 5, 4 << 20) as stream:
        with pytest.raises(WindowTooLargeError):
            stream.read()


def test_decoder_window_guard_matches_the_cap(tmp_path):
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    chunks = zstandard.ZstdCompressor(compression_params=params).compressobj()
    data = random_bytes(1 << 16)
    frame = chunks.compress(data) + chunks.flush()
    with stored_reader(tmp_path, frame, len(data), 4 << 20) as stream:
        with pytest.raises(WindowTooLargeError):
            stream.read()


def test_file_shorter_than_the_placed_range(tmp_path):
    frame = zstd_frame(b"abc")
    path = tmp_path / "short.bin"
    path.write_bytes(frame[:-1])
    digester = ChunkDigester()
    digester.update(frame)
    source = RangeFile.open(path, 0, len(frame))
    reader = FrameReader(VerifiedChunks(source, digester.finish(), "r"), 3, on_close=source.close)
    with io.BufferedReader(reader) as stream, pytest.raises(LocationError):
        stream.read()

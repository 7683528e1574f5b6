"""The parallel paths of core I/O keep every check: chunk read-ahead on pool threads, chunk
hashing on pool threads while writing, and frames compressed straight from `Segments`.

A tampered chunk is rejected with the same typed error at every read-ahead depth, a worker's error
reaches the reader in order without a hang, and failing readers leave no task or thread behind.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from helios.core.chunks import (
    ChunkDigester,
    ParallelChunkDigester,
    RangeFile,
    VerifiedChunks,
    read_ahead_workers,
)
from helios.core.errors import ChunkDigestError, LocationError
from helios.core.frame_writer import write_frame
from helios.core.reader import open_core
from helios.core.segments import Segments, SegmentsReader
from helios.core.streams import drain_decoded

from .builders import NAMESPACE, build_core, random_bytes
from .tamper import flipped

CHUNK = 4 * 1024 * 1024


def _chunk_file(tmp_path, data: bytes, chunk_nbytes: int):
    path = tmp_path / "stored.bin"
    path.write_bytes(data)
    digests = [hashlib.sha256(data[i:i + chunk_nbytes]).digest() for i in range(0, len(data), chunk_nbytes)]
    return path, digests


@pytest.mark.parametrize("read_ahead", [0, 1, 2, 6])
def test_every_depth_yields_the_verified_chunks_in_order(tmp_path, read_ahead):
    data = random_bytes(10_000, seed=3)
    path, digests = _chunk_file(tmp_path, data, 1000)
    source = RangeFile.open(path, 0, len(data))
    chunks = VerifiedChunks(source, digests, "r", 1000, read_ahead=read_ahead)
    pieces = []
    while (chunk := chunks.next_chunk()) is not None:
        pieces.append(chunk)
    chunks.close()
    source.close()
    assert b"".join(pieces) == data and len(pieces) == 10


@pytest.mark.parametrize("read_ahead", [0, 1, 2, 6])
@pytest.mark.parametrize("bad", [0, 4, 9])
def test_a_bad_chunk_fails_in_order_at_every_depth(tmp_path, read_ahead, bad):
    data = random_bytes(10_000, seed=4)
    path, digests = _chunk_file(tmp_path, data, 1000)
    digests[bad] = bytes(32)
    source = RangeFile.open(path, 0, len(data))
    chunks = VerifiedChunks(source, digests, "r", 1000, read_ahead=read_ahead)
    released = 0
    with pytest.raises(ChunkDigestError, match=f"chunk {bad} "):
        while chunks.next_chunk() is not None:
            released += 1
    chunks.close()
    source.close()
    assert released == bad  # every chunk before the bad one, none after it


def test_a_short_file_fails_from_a_worker_as_a_location_error(tmp_path):
    data = random_bytes(5000, seed=5)
    path, digests = _chunk_file(tmp_path, data, 1000)
    os.truncate(path, 2500)
    source = RangeFile.open(path, 0, len(data))
    chunks = VerifiedChunks(source, digests, "r", 1000, read_ahead=3)
    with pytest.raises(LocationError):
        while chunks.next_chunk() is not None:
            pass
    chunks.close()
    source.close()


def _pool_threads() -> int:
    return sum(t.name.startswith("helios-chunks") for t in threading.enumerate())


def test_tampered_chunk_is_rejected_while_reading_ahead_and_leaks_no_thread(tmp_path, key):
    path = tmp_path / "big.core"
    build_core(path, [key], extra={"big": random_bytes(3 * CHUNK + 123, seed=6)})
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    placement = core._loaded.placements["big"]
    for attempt in range(6):
        position = placement.offset + (attempt % 3) * CHUNK + 77
        with flipped(path, position, 0x20):
            with pytest.raises(ChunkDigestError, match="'big'"):
                core.verify_resources()
    assert _pool_threads() <= read_ahead_workers()
    assert core.verify_resources() > 3 * CHUNK  # the restored file reads cleanly again


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=12), st.integers(1, 1500))
def test_parallel_digests_equal_serial_digests(sizes, chunk_nbytes):
    serial, parallel = ChunkDigester(chunk_nbytes), ParallelChunkDigester(chunk_nbytes, in_flight=1)
    for index, size in enumerate(sizes):
        piece = random_bytes(size, seed=index)
        serial.update(piece)
        parallel.update(piece)
    assert parallel.finish() == serial.finish()
    assert parallel.nbytes == serial.nbytes


@pytest.mark.parametrize("nbytes", [0, 1, 1000, 70 * 1024 * 1024 + 5])  # the last is compressed multi-threaded
def test_segments_give_the_same_frame_as_a_stream(nbytes):
    data = (random_bytes(1 << 20, seed=7) * (nbytes // (1 << 20) + 1))[:nbytes]
    cuts = sorted({0, nbytes // 3, nbytes // 2, nbytes})
    segments = Segments(tuple(data[a:b] for a, b in zip(cuts, cuts[1:])))
    from_stream, from_segments = io.BytesIO(), io.BytesIO()
    expected = write_frame(io.BytesIO(data), from_stream, size=nbytes)
    assert write_frame(segments, from_segments) == expected
    assert from_segments.getvalue() == from_stream.getvalue()
    assert zstandard.ZstdDecompressor().decompress(from_segments.getvalue()) == data
    assert SegmentsReader(segments).read() == data == segments.to_bytes()


def test_a_core_written_from_segments_reads_back(tmp_path, key):
    data = random_bytes(2 * CHUNK + 9, seed=8)
    segments = Segments((data[:10], memoryview(data)[10:CHUNK], bytearray(data[CHUNK:])))
    build_core(tmp_path / "s.core", [key], extra={"seg": segments})
    core = open_core(tmp_path / "s.core", accept=NAMESPACE, trusted_keys=[key.public])
    assert core.read_resource("seg") == data
    with core.open_resource("seg") as stream:
        assert drain_decoded(stream) == len(data)


def test_resources_compressed_ahead_on_a_pool_give_the_same_core_bytes(tmp_path, key, monkeypatch):
    """Small in-memory resources are compressed side by side; the core is byte-identical to one
    written with every resource streamed in order, and it opens and verifies."""
    import helios.core.writer as writer_module

    extra = {f"extra.{i}": random_bytes(300_000 + 7919 * i, seed=i) for i in range(6)}
    extra["extra.stream"] = io.BytesIO(random_bytes(100_000, seed=99))  # a stream: never ahead
    ahead = []
    compress = writer_module.CoreWriter._compress_ahead
    monkeypatch.setattr(writer_module.CoreWriter, "_compress_ahead",
                        lambda self, pending: ahead.append(pending.resource_id) or compress(self, pending))
    build_core(tmp_path / "ahead.core", [key], extra=extra)
    assert {f"extra.{i}" for i in range(6)} <= set(ahead) and "extra.stream" not in ahead
    monkeypatch.setattr(writer_module, "_AHEAD_NBYTES", 0)  # nothing ahead: all streamed in order
    extra["extra.stream"] = io.BytesIO(random_bytes(100_000, seed=99))
    build_core(tmp_path / "serial.core", [key], extra=extra)
    assert (tmp_path / "ahead.core").read_bytes() == (tmp_path / "serial.core").read_bytes()
    core = open_core(tmp_path / "ahead.core", accept=NAMESPACE, trusted_keys=[key.public])
    assert core.verify_resources() > 6 * 300_000
    assert core.read_resource("extra.3") == extra["extra.3"]

"""A write begun early (`CoreWriter.begin`: the resources added so far stored on a thread while the
caller produces the rest, as preparation does with the weights during capture) gives the same core
bytes as a plain write, in every format and split; an aborted or misdirected one leaves no files."""

from __future__ import annotations

import hashlib
import io
import signal
import threading
import time

import pytest

from helios.core.reader import open_core
from helios.core.records import CoreFormat, ResourceKind
from helios.core.writer import CoreWriter

from .builders import AES_KEY, NAMESPACE, example_contract, filler, new_writer, random_bytes, required_resources

EXTRA = {f"extra.{i}": random_bytes(200_000 + 7919 * i, seed=i) for i in range(3)}


def _begun(path, keys, core_format, split_nbytes, *, finish=True):
    writer = CoreWriter(core_format, aes_key=AES_KEY if core_format.is_sealed else None,
                        nonce_prefix_for=lambda rid: hashlib.sha256(rid.encode()).digest()[:8])
    for resource_id, kind, rank in required_resources():
        writer.add_resource(resource_id, kind, filler(resource_id), rank=rank)
    writer.begin(path, split_nbytes=split_nbytes)
    for resource_id, source in EXTRA.items():  # added after begin: stored by write
        writer.add_resource(resource_id, ResourceKind.TOKENIZER, source)
    if finish:
        writer.set_contract(*example_contract())
        writer.set_publisher(NAMESPACE, license="test-license", acceptance_terms="test terms")
        for key in keys:
            writer.add_signing_key(key)
    return writer


@pytest.mark.parametrize("core_format", [CoreFormat.PAYLOAD_V2, CoreFormat.LOGICAL_V4])
@pytest.mark.parametrize("split_nbytes", [None, 150_000])
def test_a_begun_write_gives_the_plain_writes_bytes(tmp_path, key, core_format, split_nbytes):
    (tmp_path / "plain").mkdir()
    (tmp_path / "begun").mkdir()
    plain = new_writer([key], core_format=core_format, extra=EXTRA).write(tmp_path / "plain" / "m.core",
                                                                           split_nbytes=split_nbytes)
    begun = _begun(tmp_path / "begun" / "m.core", [key], core_format, split_nbytes).write(
        tmp_path / "begun" / "m.core", split_nbytes=split_nbytes)
    assert [p.name for p in plain.files] == [p.name for p in begun.files] and len(begun.files) > (split_nbytes is not None)
    for a, b in zip(plain.files, begun.files):
        assert a.read_bytes() == b.read_bytes()
    core = open_core(begun.files[0], accept=NAMESPACE, trusted_keys=[key.public],
                     aes_key=AES_KEY if core_format.is_sealed else None)
    assert core.read_resource("extra.2") == EXTRA["extra.2"]


def test_an_aborted_begun_write_leaves_no_files(tmp_path, key):
    writer = _begun(tmp_path / "m.core", [key], CoreFormat.PAYLOAD_V2, None, finish=False)
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    writer.abort()  # idempotent


def test_a_begun_write_finished_elsewhere_or_unready_is_refused_and_cleaned_up(tmp_path, key):
    writer = _begun(tmp_path / "m.core", [key], CoreFormat.PAYLOAD_V2, None)
    with pytest.raises(ValueError, match="path"):
        writer.write(tmp_path / "other.core")
    assert list(tmp_path.iterdir()) == []
    unready = _begun(tmp_path / "m.core", [key], CoreFormat.PAYLOAD_V2, None, finish=False)
    with pytest.raises(ValueError, match="set_contract"):
        unready.write(tmp_path / "m.core")
    assert list(tmp_path.iterdir()) == []


def test_begin_comes_once(tmp_path, key):
    writer = _begun(tmp_path / "m.core", [key], CoreFormat.PAYLOAD_V2, None, finish=False)
    with pytest.raises(ValueError, match="once"):
        writer.begin(tmp_path / "m.core")
    writer.abort()


class _Zeros(io.RawIOBase):
    """`reads` reads of 64 KiB of zeros, counted; the second sets `waiting`, waits for `gate`, then
    calls `on_gate`."""

    def __init__(self, reads: int, gate: threading.Event, on_gate=lambda: None):
        super().__init__()
        self.count, self._reads, self._gate, self._on_gate = 0, reads, gate, on_gate
        self.waiting = threading.Event()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.count += 1
        if self.count == 2:
            self.waiting.set()
            self._gate.wait()
            self._on_gate()
        return bytes(65536) if self.count <= self._reads else b""


def _begun_from(path, source) -> CoreWriter:
    writer = CoreWriter()
    writer.add_resource("weights", ResourceKind.WEIGHTS, source)
    writer.begin(path)
    return writer


def test_an_aborted_begun_write_stops_storing_at_its_next_read(tmp_path):
    """Ctrl-C while programs were captured waited, in `abort`, for every weight to be compressed and
    written (tens of seconds for a large model) before the temporary core was removed."""
    gate = threading.Event()
    source = _Zeros(4096, gate)
    writer = _begun_from(tmp_path / "m.core", source)
    source.waiting.wait()
    gate.set()
    writer.abort()
    assert source.count < 4096 and list(tmp_path.iterdir()) == []


def test_an_abort_interrupted_while_it_waits_still_removes_the_temporary_core(tmp_path):
    """A second Ctrl-C while `abort` waited for the storing thread left the temporary core behind
    (as large as the weights), which that thread went on writing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    gate, writer = threading.Event(), None

    def interrupt_the_wait():
        while writer.stored_early is not None:  # until `abort` dropped the begun write and waits
            time.sleep(0.001)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    source = _Zeros(64, gate, interrupt_the_wait)
    try:
        writer = _begun_from(tmp_path / "m.core", source)
        source.waiting.wait()
        gate.set()
        with pytest.raises(KeyboardInterrupt):
            writer.abort()
        assert list(tmp_path.iterdir()) == []
    finally:
        signal.signal(signal.SIGINT, previous)

"""`CoreWriter`: the API ignition uses to produce a signed core.

    writer = CoreWriter()                                   # payload format 2
    writer.set_contract(prepared)                           # or (contract_bytes, manifest_bytes)
    writer.set_publisher("acme/llama", license="llama3", acceptance_terms="...")
    writer.add_resource("program.decode.b1", ResourceKind.PROGRAM_IMAGE, image_bytes)
    writer.add_resource("weights.rank0", ResourceKind.WEIGHTS, Path("w0.safetensors"), rank=0)
    writer.add_signing_key(load_signing_key("publisher.key"))
    writer.write("model.core")                              # or split_nbytes=2**30

Each resource is compressed as exactly one zstd level-3 frame (or sealed as AES-GCM chunks for a
v4 logical-resource core) while it streams from its source into the output file; nothing large is
held whole in memory (in-memory resources under 64 MiB are compressed ahead on a small pool, side by
side, and their frames written in order: the same bytes). The writer is a single-use mutable builder: `write` consumes the sources.
"""

from __future__ import annotations

import io
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Union

from helios.contract import PreparedContract, core_pb2
from helios.core.aead import check_aead_key
from helios.core.body import SignedContent
from helios.core.catalogs import RebuildManifest, WeightCatalog
from helios.core.container import ContainerWriter
from helios.core.envelope import seal
from helios.core.keys import SigningKey, check_namespace
from helios.core.locations import encode_locations
from helios.core.payload_encode import encode_payload, store_resource
from helios.core.records import CoreFormat, Publisher, ResourceEntry, ResourceInfo, ResourceKind
from helios.core.references import check_manifest_references
from helios.core.segments import SLICE_NBYTES, Segments

Source = Union[bytes, bytearray, memoryview, BinaryIO, os.PathLike, str, Segments]


@dataclass(frozen=True)
class WrittenCore:
    """The files written (core file first) and the signed resource descriptions."""

    files: tuple[Path, ...]
    resources: tuple[ResourceInfo, ...]


@dataclass(frozen=True)
class _EarlyStore:
    """A begun write: its output, and the background storing of the first `count` resources."""

    path: Path
    split_nbytes: int | None
    container: ContainerWriter
    pool: ThreadPoolExecutor
    count: int
    future: Future
    stop: threading.Event  # set by `abort`: the storing thread stops at its next read of a source


class _Stopped(Exception):
    """The background storing of a begun write, stopped by `abort`."""


@dataclass(frozen=True)
class _StoppableSegments(Segments):
    """`Segments` whose slices end with `_Stopped` once `stop` is set."""

    stop: threading.Event

    def slices(self, slice_nbytes: int = SLICE_NBYTES):
        for piece in super().slices(slice_nbytes):
            _check_stop(self.stop)
            yield piece


class _StoppableReader(io.RawIOBase):
    """A source stream whose reads end with `_Stopped` once `stop` is set. Does not own `stream`."""

    def __init__(self, stream: BinaryIO, stop: threading.Event):
        super().__init__()
        self._stream = stream
        self._stop = stop

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        _check_stop(self._stop)
        return self._stream.read(size)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _check_stop(stop: threading.Event) -> None:
    if stop.is_set():
        raise _Stopped("the begun write was aborted")


@dataclass(frozen=True)
class _PendingResource:
    resource_id: str
    kind: ResourceKind
    rank: int | None
    source: Source


def _open_source(source: Source) -> tuple[BinaryIO | Segments, int | None, bool]:
    """(stream or segments, exact size if known, whether the writer must close the stream)."""
    if isinstance(source, Segments):
        return source, source.nbytes, False
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return io.BytesIO(data), len(data), True
    if isinstance(source, (str, os.PathLike)):
        handle = open(source, "rb")
        return handle, os.fstat(handle.fileno()).st_size, True
    return source, None, False


# In-memory resources below this size (programs, tokenizer, template) are compressed side by side on
# a small pool while the writer streams the others in order; larger ones (weights) use zstd's own
# threads. The core's bytes are the same either way.
_AHEAD_NBYTES = 64 << 20


def _small_in_memory(source: Source) -> bool:
    return isinstance(source, (bytes, bytearray, memoryview)) and len(source) < _AHEAD_NBYTES


def _ahead_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class CoreWriter:
    """Collects contract, publisher terms, resources and signing keys; `write` produces the core.

    `nonce_prefix_for` (v4 only) derives each resource's 8-byte nonce prefix; the default draws
    random prefixes. Fixed prefixes are for reproducible test fixtures only.
    """

    def __init__(
        self,
        core_format: CoreFormat = CoreFormat.PAYLOAD_V2,
        *,
        aes_key: bytes | None = None,
        nonce_prefix_for: Callable[[str], bytes] | None = None,
    ):
        if core_format.is_sealed and aes_key is None:
            raise ValueError("a v4 logical-resource core needs an AES key")
        self._format = core_format
        self._aes_key = check_aead_key(aes_key) if aes_key is not None else None
        self._nonce_prefix_for = nonce_prefix_for or (lambda _id: os.urandom(8))
        self._resources: list[_PendingResource] = []
        self._contract: tuple[bytes, bytes] | None = None
        self._publisher: Publisher | None = None
        self._rebuild: RebuildManifest | None = None
        self._catalogs: list[WeightCatalog] = []
        self._keys: list[SigningKey] = []
        self._written = False
        self._early: _EarlyStore | None = None

    def add_resource(
        self, resource_id: str, kind: ResourceKind, source: Source, *, rank: int | None = None
    ) -> None:
        """Adds a resource; `source` is bytes, a readable binary stream, a file path or `Segments`
        (borrowed buffers compressed in place; they must stay unchanged until `write`)."""
        if not resource_id or any(r.resource_id == resource_id for r in self._resources):
            raise ValueError(f"resource id {resource_id!r} is empty or already added")
        if rank is not None and rank < 0:
            raise ValueError("rank must be non-negative")
        self._resources.append(_PendingResource(resource_id, ResourceKind(kind), rank, source))

    def set_contract(self, contract, manifest: bytes | None = None) -> None:
        """A PreparedContract, or the encoded ServingContract and ExecutionManifest bytes."""
        if manifest is None:
            contract_bytes, manifest_bytes = contract.encode()
        else:
            contract_bytes, manifest_bytes = bytes(contract), bytes(manifest)
        PreparedContract.decode(contract_bytes, manifest_bytes)  # refuse an invalid contract
        self._contract = (contract_bytes, manifest_bytes)

    def set_publisher(
        self, namespace: str, *, license: str = "", acceptance_terms: str = ""
    ) -> None:
        self._publisher = Publisher(check_namespace(namespace), license, acceptance_terms)

    def set_rebuild_manifest(self, manifest: RebuildManifest) -> None:
        self._rebuild = manifest

    def add_weight_catalog(self, catalog: WeightCatalog) -> None:
        self._catalogs.append(catalog)

    def add_signing_key(self, key: SigningKey) -> None:
        self._keys.append(key)

    def _check_ready(self) -> None:
        if self._written:
            raise ValueError("a CoreWriter writes once (its sources are consumed)")
        if self._contract is None or self._publisher is None or not self._keys:
            raise ValueError("set_contract, set_publisher and add_signing_key come before write")
        planned = tuple(
            ResourceEntry(ResourceInfo(r.resource_id, r.kind, r.rank, 0, 0), 0)
            for r in self._resources
        )
        check_manifest_references(
            SignedContent(self._format, self._publisher, *self._contract, planned, None, (), 0)
        )

    def begin(self, path: os.PathLike | str, *, split_nbytes: int | None = None) -> None:
        """Opens the output now and stores the resources added so far on a background thread (and
        syncs them to disk), while the caller produces the rest; `write` with the same `path`
        finishes the core. Preparation adds the weights, begins, then captures the programs: their
        compression overlaps the capture instead of following it. The core's bytes do not depend
        on it (resources are stored in the order they were added)."""
        if self._early is not None or self._written:
            raise ValueError("begin comes once, before write")
        container = ContainerWriter(path, split_nbytes=split_nbytes)
        pending = list(self._resources)
        pool = ThreadPoolExecutor(1, thread_name_prefix="helios-store")
        stop = threading.Event()
        self._early = _EarlyStore(Path(path), split_nbytes, container, pool, len(pending),
                                  pool.submit(self._store_early, container, pending, stop), stop)

    @property
    def stored_early(self) -> Future | None:
        """The background storing `begin` started (done when those resources are on disk), or None.
        Its error (a full disk) is the write's: a caller producing the rest meanwhile may watch it
        and stop at once instead of learning it from `write`."""
        return self._early.future if self._early is not None else None

    def _store_early(self, container: ContainerWriter, pending: list[_PendingResource],
                     stop: threading.Event) -> list[ResourceEntry]:
        entries = [self._store(container, resource, stop=stop) for resource in pending]
        container.sync_data()  # what the final commit would otherwise flush all at once
        return entries

    def abort(self) -> None:
        """Drops a begun core (its temporary files); a no-op when `begin` was not called. The
        storing thread stops at its next read of a source (a Ctrl-C during capture waited for every
        weight to be compressed and written first), and the temporary files go even when the wait
        for it is interrupted (a second Ctrl-C left a file as large as the weights)."""
        early, self._early = self._early, None
        if early is not None:
            early.stop.set()
            try:
                early.future.cancel()
                early.pool.shutdown(wait=True)
            finally:
                early.container.abort()

    def write(self, path: os.PathLike | str, *, split_nbytes: int | None = None) -> WrittenCore:
        """Writes the core atomically: one file, or with `split_nbytes` a core file plus parts
        of about that size (a resource never spans parts)."""
        early = self._early
        if early is not None and (Path(path) != early.path or split_nbytes != early.split_nbytes):
            self.abort()
            raise ValueError("write goes to the path (and split) that begin opened")
        try:
            self._check_ready()
        except BaseException:
            self.abort()
            raise
        self._written = True
        container = early.container if early is not None else ContainerWriter(path, split_nbytes=split_nbytes)
        first = early.count if early is not None else 0
        with container, ThreadPoolExecutor(_ahead_workers(), thread_name_prefix="helios-compress") as pool:
            ahead = {index: pool.submit(self._compress_ahead, pending) for index, pending in enumerate(self._resources)
                     if index >= first and _small_in_memory(pending.source) and not self._format.is_sealed}
            try:
                entries = []
                if early is not None:
                    try:
                        entries = early.future.result()
                    except BaseException:
                        early.stop.set()  # interrupted while waiting: nothing more is stored
                        raise
                    finally:
                        early.pool.shutdown(wait=True)
                entries += [self._store(container, pending, ahead.get(index))
                            for index, pending in enumerate(self._resources) if index >= first]
            finally:
                for future in ahead.values():
                    future.cancel()
            if self._format.is_sealed and len({entry.nonce_prefix for entry in entries}) != len(entries):
                raise ValueError("nonce_prefix_for gave two resources the same prefix (readers refuse reused nonces)")
            payload = encode_payload(
                self._format, self._contract, self._publisher, entries, self._rebuild,
                self._catalogs,
            )
            body = core_pb2.CoreBody(
                format_version=self._format.format_version,
                envelope=seal(self._format.format_version, payload, self._keys),
                locations=encode_locations(container.placements),
            )
            files = container.commit(body.SerializeToString(deterministic=True))
        return WrittenCore(files, tuple(entry.info for entry in entries))

    def _compress_ahead(self, pending: _PendingResource) -> tuple[ResourceEntry, bytes]:
        """The resource's entry and stored frame, compressed in memory (the bytes `_store` would
        stream: zstd's output depends only on the content and the settings)."""
        stream, size, _ = _open_source(pending.source)
        frame = io.BytesIO()
        entry = store_resource(stream, frame, size=size, resource_id=pending.resource_id, kind=pending.kind,
                               rank=pending.rank, aes_key=None, nonce_prefix=b"")
        return entry, frame.getvalue()

    def _store(self, container: ContainerWriter, pending: _PendingResource, ahead=None,
               stop: threading.Event | None = None) -> ResourceEntry:
        """Stores one resource; with `stop` (a begun write's), its source's reads end once it is set."""
        if ahead is not None:  # compressed on the pool: only its stored bytes are written here
            entry, frame = ahead.result()
            container.begin_resource().write(frame)
            container.end_resource(pending.resource_id)
            return entry
        stream, size, owned = _open_source(pending.source)
        try:
            source = stream if stop is None else _stoppable(stream, stop)
            sink = container.begin_resource()
            nonce = self._nonce_prefix_for(pending.resource_id) if self._format.is_sealed else b""
            entry = store_resource(
                source, sink, size=size, resource_id=pending.resource_id, kind=pending.kind,
                rank=pending.rank, aes_key=self._aes_key, nonce_prefix=nonce,
            )
            container.end_resource(pending.resource_id)
            return entry
        finally:
            if owned:
                stream.close()


def _stoppable(source: BinaryIO | Segments, stop: threading.Event) -> BinaryIO | Segments:
    """`source` read through a check of `stop` (before each slice of `Segments`, each read of a stream)."""
    if isinstance(source, Segments):
        return _StoppableSegments(source.buffers, stop)
    return _StoppableReader(source, stop)

"""Encoding stored resources and the signed payload (DeploymentBody or ModelIndex).

The payload is serialized deterministically once and signed as those exact bytes; readers verify
the bytes as stored and never re-encode them.
"""

from __future__ import annotations

from typing import BinaryIO, Sequence

from helios.contract import core_pb2
from helios.core.aead import write_aead_resource
from helios.core.catalogs import RebuildManifest, WeightCatalog
from helios.core.chunks import CHUNK_NBYTES
from helios.core.frame_writer import write_frame
from helios.core.records import CoreFormat, Publisher, ResourceEntry, ResourceInfo, ResourceKind
from helios.core.segments import Segments, SegmentsReader


def store_resource(
    source: BinaryIO | Segments,
    sink: BinaryIO,
    *,
    size: int | None,
    resource_id: str,
    kind: ResourceKind,
    rank: int | None,
    aes_key: bytes | None,
    nonce_prefix: bytes,
) -> ResourceEntry:
    """Streams `source` into `sink` as a zstd frame (or, with `aes_key`, as sealed v4 chunks)."""
    if aes_key is not None:
        if isinstance(source, Segments):
            source = SegmentsReader(source)
        sealed = write_aead_resource(
            source, sink, key=aes_key, resource_id=resource_id, nonce_prefix=nonce_prefix
        )
        info = ResourceInfo(resource_id, kind, rank, sealed.stored_nbytes, sealed.decoded_nbytes)
        return ResourceEntry(info, CHUNK_NBYTES, nonce_prefix=nonce_prefix)
    frame = write_frame(source, sink, size=size)
    info = ResourceInfo(resource_id, kind, rank, frame.stored_nbytes, frame.decoded_nbytes)
    return ResourceEntry(info, CHUNK_NBYTES, frame.chunk_sha256)


def _resource_fields(entry: ResourceEntry) -> dict:
    info = entry.info
    fields = dict(
        id=info.id,
        kind=int(info.kind),
        stored_nbytes=info.stored_nbytes,
        decoded_nbytes=info.decoded_nbytes,
        chunk_nbytes=entry.chunk_nbytes,
        chunk_sha256=list(entry.chunk_sha256),
    )
    if info.rank is not None:
        fields["rank"] = info.rank
    return fields


def encode_payload(
    core_format: CoreFormat,
    contract: tuple[bytes, bytes],
    publisher: Publisher,
    entries: Sequence[ResourceEntry],
    rebuild: RebuildManifest | None,
    catalogs: Sequence[WeightCatalog],
) -> bytes:
    """The exact payload bytes to sign."""
    terms = core_pb2.PublisherTerms(
        namespace=publisher.namespace,
        license=publisher.license,
        acceptance_terms=publisher.acceptance_terms,
    )
    if core_format is CoreFormat.PAYLOAD_V2:
        message = core_pb2.DeploymentBody(
            publisher=terms, resources=[_resource_fields(e) for e in entries]
        )
    else:
        resources = [
            core_pb2.LogicalResource(nonce_prefix=e.nonce_prefix, **_resource_fields(e))
            for e in entries
        ]
        index = core_pb2.ProtectedIndex(version=core_format.index_version, resources=resources)
        message = core_pb2.ModelIndex(publisher=terms, index=index)
    message.contract.MergeFromString(contract[0])
    message.manifest.MergeFromString(contract[1])
    if rebuild is not None:
        message.rebuild.CopyFrom(rebuild.to_proto())
    message.weight_catalogs.extend(catalog.to_proto() for catalog in catalogs)
    return message.SerializeToString(deterministic=True)

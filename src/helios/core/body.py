"""Decoding the CoreBody and the signed payload, in the order trust requires.

1. `parse_core_body`: the unsigned outer message. It must be canonical protobuf with no unknown
   fields, so every byte of it is meaningful and a flipped byte cannot pass unnoticed.
2. (the caller verifies signatures over `envelope.payload`)
3. `parse_payload` + `publisher_of`: protobuf parse of the verified payload and its publisher
   terms, which authorization needs. Contract and manifest stay inert protobuf data.
4. (the caller authorizes)
5. `signed_content`: resource commitments checked for form, catalogs read, contract and manifest
   bytes extracted for `PreparedContract.decode`.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from helios.contract import core_pb2
from helios.core.aead import NONCE_PREFIX_NBYTES, aead_stored_nbytes
from helios.core.catalogs import RebuildManifest, WeightCatalog, read_catalogs, read_rebuild
from helios.core.chunks import CHUNK_NBYTES, chunk_count
from helios.core.errors import DecodedSizeError, MalformedCoreError, UnknownFormatError
from helios.core.keys import check_namespace
from helios.core.zstd_frame import max_decoded_nbytes
from helios.core.records import (
    FORMAT_LOGICAL_RESOURCE,
    FORMAT_PAYLOAD,
    CoreFormat,
    Publisher,
    ResourceEntry,
    ResourceInfo,
    ResourceKind,
)

MAX_RESOURCES = 65536
_KINDS = {int(kind) for kind in ResourceKind}


def _reject_unknown_fields(message: Message, path: str) -> None:
    if len(UnknownFieldSet(message)):
        raise MalformedCoreError(f"{path} carries unknown fields")
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        items = value if field.is_repeated else [value]
        for index, item in enumerate(items):
            _reject_unknown_fields(item, f"{path}.{field.name}[{index}]")


def parse_core_body(data: bytes) -> core_pb2.CoreBody:
    """The CoreBody of `data`; raises MalformedCoreError / UnknownFormatError."""
    try:
        body = core_pb2.CoreBody.FromString(data)
    except DecodeError:
        raise MalformedCoreError("the core body is not a valid CoreBody message") from None
    _reject_unknown_fields(body, "body")
    if body.SerializeToString(deterministic=True) != data:
        raise MalformedCoreError("the core body is not canonically encoded")
    if body.format_version not in (FORMAT_PAYLOAD, FORMAT_LOGICAL_RESOURCE):
        raise UnknownFormatError(f"payload format {body.format_version} is not readable")
    return body


def parse_payload(format_version: int, payload: bytes) -> Message:
    """The DeploymentBody (format 2) or ModelIndex (format 1) of a verified payload."""
    kind = core_pb2.DeploymentBody if format_version == FORMAT_PAYLOAD else core_pb2.ModelIndex
    try:
        return kind.FromString(payload)
    except DecodeError:
        raise MalformedCoreError(f"the signed payload is not a valid {kind.__name__}") from None


def publisher_of(message: Message) -> Publisher:
    terms = message.publisher
    try:
        namespace = check_namespace(terms.namespace)
    except ValueError as error:
        raise MalformedCoreError(f"publisher.namespace: {error}") from None
    return Publisher(namespace, terms.license, terms.acceptance_terms)


@dataclass(frozen=True)
class SignedContent:
    """Everything the verified, authorized payload says, in carrier-independent form."""

    core_format: CoreFormat
    publisher: Publisher
    contract_bytes: bytes
    manifest_bytes: bytes
    resources: tuple[ResourceEntry, ...]
    rebuild: RebuildManifest | None
    weight_catalogs: tuple[WeightCatalog, ...]
    ignored_catalogs: int


def _info(message, path: str) -> ResourceInfo:
    if not message.id or len(message.id.encode()) > 1024:
        raise MalformedCoreError(f"{path}.id must be 1 to 1024 bytes")
    if message.kind not in _KINDS:
        raise MalformedCoreError(f"{path}.kind {message.kind} is not a known resource kind")
    if message.chunk_nbytes != CHUNK_NBYTES:
        raise MalformedCoreError(f"{path}.chunk_nbytes must be {CHUNK_NBYTES}")
    rank = message.rank if message.HasField("rank") else None
    kind = ResourceKind(message.kind)
    return ResourceInfo(message.id, kind, rank, message.stored_nbytes, message.decoded_nbytes)


def _frame_entry(message, path: str) -> ResourceEntry:
    info = _info(message, path)
    digests = tuple(bytes(d) for d in message.chunk_sha256)
    if info.stored_nbytes == 0 or len(digests) != chunk_count(info.stored_nbytes):
        raise MalformedCoreError(f"{path}: chunk digests do not cover the stored frame")
    if any(len(d) != 32 for d in digests):
        raise MalformedCoreError(f"{path}.chunk_sha256: every digest is 32 bytes")
    if info.decoded_nbytes > max_decoded_nbytes(info.stored_nbytes):
        raise DecodedSizeError(
            f"{path}: a frame of {info.stored_nbytes} bytes cannot decode to the signed {info.decoded_nbytes}")
    if getattr(message, "nonce_prefix", b""):
        raise MalformedCoreError(f"{path}.nonce_prefix is only for version 4 indexes")
    return ResourceEntry(info, CHUNK_NBYTES, digests)


def _sealed_entry(message, path: str) -> ResourceEntry:
    info = _info(message, path)
    if info.stored_nbytes != aead_stored_nbytes(info.decoded_nbytes):
        raise MalformedCoreError(f"{path}: stored length does not fit the sealed chunks")
    if len(message.nonce_prefix) != NONCE_PREFIX_NBYTES or message.chunk_sha256:
        raise MalformedCoreError(f"{path}: a v4 resource has an 8-byte nonce prefix only")
    return ResourceEntry(info, CHUNK_NBYTES, nonce_prefix=bytes(message.nonce_prefix))


def _core_format(format_version: int, message: Message) -> CoreFormat:
    if format_version == FORMAT_PAYLOAD:
        return CoreFormat.PAYLOAD_V2
    for candidate in (CoreFormat.LOGICAL_V6, CoreFormat.LOGICAL_V4):
        if message.index.version == candidate.index_version:
            return candidate
    raise UnknownFormatError(f"protected index version {message.index.version} is not readable")


def _entries(core_format: CoreFormat, message: Message) -> tuple[ResourceEntry, ...]:
    if core_format is CoreFormat.PAYLOAD_V2:
        items, path = message.resources, "payload.resources"
    else:
        items, path = message.index.resources, "payload.index.resources"
    if len(items) > MAX_RESOURCES:
        raise MalformedCoreError(f"more than {MAX_RESOURCES} resources")
    make = _sealed_entry if core_format.is_sealed else _frame_entry
    entries = tuple(make(item, f"{path}[{i}]") for i, item in enumerate(items))
    if len({e.id for e in entries}) != len(entries):
        raise MalformedCoreError(f"{path}: resource ids are not unique")
    # Chunk i of every resource is sealed under prefix || i: a shared prefix reuses AES-GCM nonces
    # under one key, which exposes the plaintexts' XOR and lets anyone forge chunks that authenticate.
    if core_format.is_sealed and len({e.nonce_prefix for e in entries}) != len(entries):
        raise MalformedCoreError(f"{path}: nonce prefixes are not unique")
    return entries


def signed_content(format_version: int, message: Message, publisher: Publisher) -> SignedContent:
    """Checks the form of the authorized payload and returns it carrier-independently."""
    core_format = _core_format(format_version, message)
    if not message.HasField("contract") or not message.HasField("manifest"):
        raise MalformedCoreError("the payload lacks the serving contract or execution manifest")
    catalogs, ignored = read_catalogs(message.weight_catalogs)
    return SignedContent(
        core_format=core_format,
        publisher=publisher,
        contract_bytes=message.contract.SerializeToString(deterministic=True),
        manifest_bytes=message.manifest.SerializeToString(deterministic=True),
        resources=_entries(core_format, message),
        rebuild=read_rebuild(message.rebuild) if message.HasField("rebuild") else None,
        weight_catalogs=catalogs,
        ignored_catalogs=ignored,
    )

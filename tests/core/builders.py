"""Test helpers: cores built on the example contract, hand-crafted frames, and file regions.

Every core needs the resources its manifest names; `new_writer` adds them (small deterministic
bytes) so tests only add what they are about. `craft_core` stores frames verbatim with honest
chunk digests and a valid signature, for frames no writer would produce (bombs, huge windows,
trailing bytes): the checks that must catch them are the frame checks, not the signature.
"""

from __future__ import annotations

import functools
import hashlib
import io
import random
from pathlib import Path
from typing import Iterable, Mapping

from helios.contract import PreparedContract, core_pb2, manifest_pb2
from helios.core.chunks import CHUNK_NBYTES, ChunkDigester
from helios.core.container import ContainerWriter
from helios.core.envelope import seal
from helios.core.frame_writer import write_frame
from helios.core.keys import SigningKey
from helios.core.layout import HEADER, HEADER_NBYTES
from helios.core.locations import encode_locations
from helios.core.payload_encode import encode_payload
from helios.core.records import (
    CoreFormat,
    Publisher,
    ResourceEntry,
    ResourceInfo,
    ResourceKind,
)
from helios.core.writer import CoreWriter, WrittenCore

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CONTRACT = REPO / "examples" / "contract.json"
NAMESPACE = "test.helios/core-suite"
AES_KEY = bytes(range(32))


@functools.cache
def example_contract() -> tuple[bytes, bytes]:
    return PreparedContract.from_json(EXAMPLE_CONTRACT.read_text()).encode()


@functools.cache
def required_resources() -> tuple[tuple[str, ResourceKind, int | None], ...]:
    """(id, kind, rank) of every resource the example manifest names."""
    manifest = manifest_pb2.ExecutionManifest.FromString(example_contract()[1])
    found: dict[str, tuple[str, ResourceKind, int | None]] = {}
    for buffer in manifest.buffers:
        if buffer.resource_id:
            found[buffer.resource_id] = (buffer.resource_id, ResourceKind.WEIGHTS, 0)
    for handle in manifest.graph_handles:
        found[handle.resource_id] = (handle.resource_id, ResourceKind.PROGRAM, handle.rank)
    return tuple(found.values())


def filler(resource_id: str, nbytes: int = 48) -> bytes:
    return hashlib.sha256(resource_id.encode()).digest() * (nbytes // 32) + b"\x00" * (nbytes % 32)


def random_bytes(nbytes: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(nbytes)


def new_writer(
    keys: Iterable[SigningKey],
    *,
    core_format: CoreFormat = CoreFormat.PAYLOAD_V2,
    extra: Mapping[str, object] = {},
    namespace: str = NAMESPACE,
) -> CoreWriter:
    writer = CoreWriter(
        core_format,
        aes_key=AES_KEY if core_format.is_sealed else None,
        nonce_prefix_for=lambda rid: hashlib.sha256(rid.encode()).digest()[:8],
    )
    writer.set_contract(*example_contract())
    writer.set_publisher(namespace, license="test-license", acceptance_terms="test terms")
    for resource_id, kind, rank in required_resources():
        writer.add_resource(resource_id, kind, filler(resource_id), rank=rank)
    for resource_id, source in extra.items():
        writer.add_resource(resource_id, ResourceKind.TOKENIZER, source)
    for key in keys:
        writer.add_signing_key(key)
    return writer


def build_core(
    path: Path,
    keys: Iterable[SigningKey],
    *,
    core_format: CoreFormat = CoreFormat.PAYLOAD_V2,
    extra: Mapping[str, object] = {},
    split_nbytes: int | None = None,
    namespace: str = NAMESPACE,
) -> WrittenCore:
    writer = new_writer(keys, core_format=core_format, extra=extra, namespace=namespace)
    return writer.write(path, split_nbytes=split_nbytes)


def zstd_frame(data: bytes, *, with_size: bool = True) -> bytes:
    sink = io.BytesIO()
    write_frame(io.BytesIO(data), sink, size=len(data) if with_size else None)
    return sink.getvalue()


def raw_block_frame(data: bytes, *, window_exponent: int = 7) -> bytes:
    """A valid zstd frame of raw blocks (no content size, no checksum); window 2**(10+exp)."""
    out = bytearray(b"\x28\xb5\x2f\xfd\x00" + bytes([window_exponent << 3]))
    block = 128 * 1024
    pieces = [data[i : i + block] for i in range(0, len(data), block)] or [b""]
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        out += (len(piece) << 3 | int(last)).to_bytes(3, "little") + piece
    return bytes(out)


def raw_frame_of_stored_size(stored_nbytes: int, seed: int = 0) -> tuple[bytes, bytes]:
    """(frame, decoded) with the frame exactly `stored_nbytes` long (>= 9 bytes)."""
    blocks = max(1, -(-(stored_nbytes - 6) // (128 * 1024 + 3)))
    data = random_bytes(stored_nbytes - 6 - 3 * blocks, seed)
    frame = raw_block_frame(data)
    assert len(frame) == stored_nbytes
    return frame, data


def craft_core(
    path: Path,
    keys: Iterable[SigningKey],
    stored: Mapping[str, tuple[bytes, int]],
    *,
    namespace: str = NAMESPACE,
    omit: frozenset[str] | set[str] = frozenset(),
) -> Path:
    """A payload core holding `stored` frames verbatim: id -> (stored bytes, signed decoded length).

    The manifest's resources (less `omit`) are added as honest frames. Chunk digests are honest.
    """
    frames = {
        rid: (zstd_frame(filler(rid)), 48) for rid, _, _ in required_resources() if rid not in omit
    }
    frames.update(stored)
    kinds = {rid: (kind, rank) for rid, kind, rank in required_resources()}
    with ContainerWriter(path) as container:
        entries = []
        for rid, (data, decoded) in frames.items():
            container.begin_resource().write(data)
            container.end_resource(rid)
            digester = ChunkDigester()
            digester.update(data)
            kind, rank = kinds.get(rid, (ResourceKind.TOKENIZER, None))
            info = ResourceInfo(rid, kind, rank, len(data), decoded)
            entries.append(ResourceEntry(info, CHUNK_NBYTES, digester.finish()))
        payload = encode_payload(
            CoreFormat.PAYLOAD_V2, example_contract(), Publisher(namespace), entries, None, ()
        )
        body = core_pb2.CoreBody(
            format_version=2,
            envelope=seal(2, payload, list(keys)),
            locations=encode_locations(container.placements),
        )
        container.commit(body.SerializeToString(deterministic=True))
    return path


def read_body(path: Path) -> tuple[int, core_pb2.CoreBody]:
    data = path.read_bytes()
    _, _, _, offset, nbytes = HEADER.unpack(data[:HEADER_NBYTES])
    return offset, core_pb2.CoreBody.FromString(data[offset : offset + nbytes])


def write_body(path: Path, body: core_pb2.CoreBody) -> None:
    """Replaces the CoreBody of a core file (the header is updated to match)."""
    data = path.read_bytes()
    _, _, _, offset, _ = HEADER.unpack(data[:HEADER_NBYTES])
    encoded = body.SerializeToString(deterministic=True)
    header = HEADER.pack(data[:8], 1, 0, offset, len(encoded))
    path.write_bytes(header + data[HEADER_NBYTES:offset] + encoded)


def find_region(haystack: bytes, needle: bytes, start: int = 0) -> tuple[int, int]:
    position = haystack.index(needle, start)
    return position, position + len(needle)


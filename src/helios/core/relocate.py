"""Rewriting a core's files without touching what is signed: relocate, split, join, co-sign.

The signed envelope payload is copied byte for byte; only the unsigned LocationSet (and, for
`add_signatures`, the signature list) changes. Stored bytes are copied verbatim, each 4 MiB chunk
checked against its signed digest on the way (sealed v4 chunks are copied as stored: only the
operator's key can authenticate them), so a rewrite never launders corrupt data into a core.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from helios.contract import core_pb2
from helios.core.container import ContainerWriter
from helios.core.envelope import sign
from helios.core.errors import BadSignatureError
from helios.core.keys import SigningKey
from helios.core.locations import encode_locations
from helios.core.reader import LoadedCore, load_unverified
from helios.core.streams import copy_stored, drain_decoded, open_decoded


def _write(
    loaded: LoadedCore,
    destination: Path,
    envelope: core_pb2.SignedEnvelope,
    split_nbytes: int | None,
) -> tuple[Path, ...]:
    # The source's parts stay unless the source is the core replaced (in place): a core that
    # `add_signatures` wrote beside it may read them too.
    keep = () if _same_file(loaded.path, destination) else _parts_of(loaded)
    with ContainerWriter(destination, split_nbytes=split_nbytes, keep=keep) as container:
        for entry in loaded.content.resources:
            sink = container.begin_resource()
            copy_stored(loaded.stored_path(entry.id), loaded.placements[entry.id], entry, sink)
            container.end_resource(entry.id)
        body = core_pb2.CoreBody(
            format_version=loaded.body.format_version,
            envelope=envelope,
            locations=encode_locations(container.placements),
        )
        return container.commit(body.SerializeToString(deterministic=True))


def relocate_core(
    source: os.PathLike | str,
    destination: os.PathLike | str,
    *,
    split_nbytes: int | None = None,
) -> tuple[Path, ...]:
    """Writes `source` as a single-file core (or split into parts) at `destination`.

    `destination` may equal `source`. Returns the written files, the core file first. The parts of
    the core `destination` replaces that the new one does not name are removed (`ContainerWriter`),
    but for those a different `source` reads.
    """
    loaded = load_unverified(source)
    return _write(loaded, Path(destination), loaded.body.envelope, split_nbytes)


def verify_stored(loaded: LoadedCore, aes_key: bytes | None) -> int:
    """Decodes every resource against its commitments (sealed ones only with `aes_key`)."""
    total = 0
    for entry in loaded.content.resources:
        if loaded.content.core_format.is_sealed and aes_key is None:
            continue
        with open_decoded(
            loaded.stored_path(entry.id),
            loaded.placements[entry.id],
            entry,
            is_sealed=loaded.content.core_format.is_sealed,
            aes_key=aes_key,
        ) as stream:
            total += drain_decoded(stream)
    return total


def add_signatures(
    source: os.PathLike | str,
    destination: os.PathLike | str,
    keys: Iterable[SigningKey],
    *,
    replace: bool = False,
    aes_key: bytes | None = None,
) -> tuple[Path, ...]:
    """Co-signs (or with `replace`, re-signs) the payload of `source` into `destination`.

    Signs only what it checked: every existing signature must verify and every resource must
    decode against its commitments first. The layout (single file or parts) is kept.
    """
    loaded = load_unverified(source)
    verify_stored(loaded, aes_key)
    envelope = core_pb2.SignedEnvelope()
    envelope.CopyFrom(loaded.body.envelope)
    if replace:
        del envelope.signatures[:]
    present = {bytes(s.public_key) for s in envelope.signatures}
    for key in keys:
        if key.public.raw in present:
            raise BadSignatureError(f"key {key.key_id.hex()} already signed this core")
        envelope.signatures.append(sign(loaded.body.format_version, envelope.payload, key))
        present.add(key.public.raw)
    ordered = sorted(envelope.signatures, key=lambda s: bytes(s.key_id))
    del envelope.signatures[:]
    envelope.signatures.extend(ordered)
    destination = Path(destination)
    if _siblings_stay(loaded, destination):
        return _write_body_only(loaded, destination, envelope)
    split = None if all(not p.file for p in loaded.placements.values()) else 1
    return _write(loaded, destination, envelope, split)


def _siblings_stay(loaded: LoadedCore, destination: Path) -> bool:
    """True when every resource lies in a sibling that `destination` can keep referencing."""
    in_siblings = all(placement.file for placement in loaded.placements.values())
    same_dir = destination.parent.resolve() == loaded.path.parent.resolve()
    renamed_onto = any(p.file == destination.name for p in loaded.placements.values())
    return in_siblings and same_dir and not renamed_onto


def _write_body_only(
    loaded: LoadedCore, destination: Path, envelope: core_pb2.SignedEnvelope
) -> tuple[Path, ...]:
    with ContainerWriter(destination, keep=_parts_of(loaded)) as container:
        body = core_pb2.CoreBody(
            format_version=loaded.body.format_version,
            envelope=envelope,
            locations=loaded.body.locations,
        )
        files = container.commit(body.SerializeToString(deterministic=True))
    return files + tuple(sorted(_parts_of(loaded)))


def _parts_of(loaded: LoadedCore) -> set[Path]:
    """The part files `loaded` stores resources in."""
    return {loaded.path.parent / p.file for p in loaded.placements.values() if p.file}


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False

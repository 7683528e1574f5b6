"""Opening a core: verify, authorize, then (and only then) interpret it.

`open_core` runs the checks in this order and stops at the first failure, raising its typed error:

1. file header and CoreBody (canonical, no unknown fields, known payload format);
2. every envelope signature verifies over the exact payload bytes;
3. at least one signer is trusted (before the payload is even parsed);
4. payload parsed; the acceptance string equals the signed publisher namespace and a signer is
   trusted for it (`authorize`);
5. resource commitments, the serving contract (`PreparedContract.decode`), manifest resource
   references and the LocationSet (every file tiled exactly).

Stored resources are read lazily: `open_resource` streams one resource, verifying each chunk before
it is decoded. Nothing of a program or weight is deserialized here at all.

`inspect_core` is the unverified view for `helios inspect`: it checks signatures cryptographically
but trusts no key and authorizes nothing; its result says so.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Mapping

from helios.contract import PreparedContract, core_pb2
from helios.core.authorize import authorize, trusted_signers
from helios.core.body import (
    SignedContent,
    parse_core_body,
    parse_payload,
    publisher_of,
    signed_content,
)
from helios.core.catalogs import RebuildManifest, WeightCatalog
from helios.core.envelope import check_signatures
from helios.core.errors import UnknownResourceError, UntrustedSignerError
from helios.core.keys import PublicKey, TrustedKeys
from helios.core.layout import RawCore, read_raw_core
from helios.core.locations import placement_path, resolve_locations
from helios.core.records import CoreFormat, Placement, Publisher, ResourceEntry, ResourceInfo
from helios.core.references import check_manifest_references
from helios.core.streams import drain_decoded, open_decoded, read_decoded


@dataclass(frozen=True)
class LoadedCore:
    """A parsed core before trust decisions: raw parts, signers, signed content, placements."""

    path: Path
    raw: RawCore
    body: core_pb2.CoreBody
    signers: tuple[PublicKey, ...]
    content: SignedContent
    placements: Mapping[str, Placement]

    def entry(self, resource_id: str) -> ResourceEntry:
        for entry in self.content.resources:
            if entry.id == resource_id:
                return entry
        raise UnknownResourceError(f"the core has no resource {resource_id!r}")

    def stored_path(self, resource_id: str) -> Path:
        return placement_path(self.path, self.placements[resource_id])


def core_file(path: os.PathLike | str, locations: core_pb2.LocationSet) -> Path:
    """The path a core's siblings (its part files, named in `locations`) are looked up beside: `path`
    as given, unless it is a symbolic link whose directory lacks one of them, then the file the link
    names (a split core reached through a link in another directory: its parts lie beside the file).
    A store of links, one per file (a model cache's snapshot of links into its blobs), keeps every
    part beside the link, named as the core names it, where the file it names has none."""
    path = Path(path)
    if not path.is_symlink():
        return path
    names = {location.file for location in locations.locations if location.file}
    if all(os.path.lexists(path.parent / name) for name in names):
        return path
    return path.resolve()


def _read_signed(path: Path) -> tuple[RawCore, core_pb2.CoreBody, tuple[PublicKey, ...]]:
    raw = read_raw_core(path)
    body = parse_core_body(raw.body)
    return raw, body, check_signatures(body.format_version, body.envelope)


def _complete(path: Path, raw: RawCore, body, signers, message, publisher) -> LoadedCore:
    content = signed_content(body.format_version, message, publisher)
    placements = resolve_locations(
        body.locations, content.resources, path, raw.header.body_offset
    )
    return LoadedCore(path, raw, body, signers, content, placements)


def load_unverified(path: os.PathLike | str) -> LoadedCore:
    """Parses a core, checking signatures cryptographically but trusting no key.

    For tooling that copies or inspects cores (inspect, relocate, sign); never for serving.
    """
    raw, body, signers = _read_signed(Path(path))
    path = core_file(path, body.locations)
    message = parse_payload(body.format_version, body.envelope.payload)
    return _complete(path, raw, body, signers, message, publisher_of(message))


def _as_trusted(trusted_keys) -> TrustedKeys:
    if isinstance(trusted_keys, TrustedKeys):
        return trusted_keys
    items = list(trusted_keys)
    if all(isinstance(item, PublicKey) for item in items):
        return TrustedKeys.of(items)
    return TrustedKeys.from_paths(items)


class Core:
    """A verified, authorized core. Immutable; each `open_resource` stream is independent.

    `prepared` is the decoded, validated PreparedContract. Resources are verified as they are
    read; `verify_resources` reads them all.
    """

    def __init__(
        self,
        loaded: LoadedCore,
        admitted: tuple[PublicKey, ...],
        prepared: PreparedContract,
        aes_key: bytes | None,
    ):
        self._loaded = loaded
        self._aes_key = aes_key
        self.prepared = prepared
        self.admitted_signers = admitted

    @property
    def path(self) -> Path:
        return self._loaded.path

    @functools.cached_property
    def body_sha256(self) -> bytes:
        """The SHA-256 of the core file's signed body (contract, manifest, resource commitments and
        signatures): what names this core in records a load keeps of it."""
        return hashlib.sha256(self._loaded.raw.body).digest()

    @property
    def core_format(self) -> CoreFormat:
        return self._loaded.content.core_format

    @property
    def publisher(self) -> Publisher:
        return self._loaded.content.publisher

    @property
    def rebuild(self) -> RebuildManifest | None:
        return self._loaded.content.rebuild

    @property
    def weight_catalogs(self) -> tuple[WeightCatalog, ...]:
        return self._loaded.content.weight_catalogs

    @property
    def resources(self) -> tuple[ResourceInfo, ...]:
        return tuple(entry.info for entry in self._loaded.content.resources)

    def resource(self, resource_id: str) -> ResourceInfo:
        return self._loaded.entry(resource_id).info

    def open_resource(self, resource_id: str) -> BinaryIO:
        """A binary stream of the decoded resource, verified while it streams; caller closes."""
        entry = self._loaded.entry(resource_id)
        return open_decoded(
            self._loaded.stored_path(resource_id),
            self._loaded.placements[resource_id],
            entry,
            is_sealed=self.core_format.is_sealed,
            aes_key=self._aes_key,
        )

    def read_resource(self, resource_id: str) -> bytes:
        """The whole decoded resource (for small resources; stream big ones)."""
        with self.open_resource(resource_id) as stream:
            return read_decoded(stream, self.resource(resource_id).decoded_nbytes, f"resource {resource_id!r}")

    def verify_resources(self) -> int:
        """Reads every resource to its end (all checks run); returns the decoded byte total."""
        total = 0
        for info in self.resources:
            with self.open_resource(info.id) as stream:
                total += drain_decoded(stream)
        return total


def open_core(
    path: os.PathLike | str,
    *,
    accept: str,
    trusted_keys: TrustedKeys | Iterable[PublicKey] | Iterable[os.PathLike | str],
    aes_key: bytes | None = None,
) -> Core:
    """Verifies and authorizes the core at `path` and returns it (see the module docstring)."""
    trusted = _as_trusted(trusted_keys)
    raw, body, signers = _read_signed(Path(path))
    path = core_file(path, body.locations)
    if not trusted_signers(signers, trusted):
        ids = ", ".join(s.key_id.hex() for s in signers)
        raise UntrustedSignerError(f"no trusted key signed the core (signed by {ids})")
    message = parse_payload(body.format_version, body.envelope.payload)
    publisher = publisher_of(message)
    admitted = authorize(publisher.namespace, signers, trusted, accept)
    loaded = _complete(path, raw, body, signers, message, publisher)
    # The specification's rules: a valid core verifies even where this runtime cannot serve it
    # (loading checks that, helios.runtime.loading.model).
    prepared = PreparedContract.decode(loaded.content.contract_bytes, loaded.content.manifest_bytes, servable=False)
    check_manifest_references(loaded.content)
    return Core(loaded, admitted, prepared, aes_key)

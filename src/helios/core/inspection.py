"""The unverified view of a core, for `helios inspect`.

Nothing here decides trust: signatures are checked cryptographically (a signature that does not
verify is reported, not hidden), but no key is trusted, no acceptance string is compared and no
stored resource is read. `CoreInspection.is_verified` is always False so that no caller can
mistake this view for a verified core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from helios.core.body import parse_core_body, parse_payload, publisher_of, signed_content
from helios.core.envelope import signature_reports
from helios.core.layout import read_raw_core
from helios.core.locations import resolve_locations
from helios.core.records import CoreFormat, Placement, Publisher, ResourceInfo
from helios.errors import ContractError, HeliosError


@dataclass(frozen=True)
class SignatureReport:
    key_id: str
    is_valid: bool


@dataclass(frozen=True)
class CoreInspection:
    """What a core claims about itself. Unverified: trust nothing here for serving."""

    path: str
    core_format: CoreFormat
    publisher: Publisher
    signatures: tuple[SignatureReport, ...]
    resources: tuple[ResourceInfo, ...]
    placements: dict[str, Placement]
    location_problem: str | None
    prepared: object | None
    contract_problem: str | None
    ignored_catalogs: int
    is_verified: bool = False


def inspect_core(path: os.PathLike | str) -> CoreInspection:
    """Reads a core's claims without authorization; raises CoreError if it cannot be parsed."""
    from helios.contract import PreparedContract

    path = Path(path)
    raw = read_raw_core(path)
    body = parse_core_body(raw.body)
    reports = signature_reports(body.format_version, body.envelope)
    message = parse_payload(body.format_version, body.envelope.payload)
    content = signed_content(body.format_version, message, publisher_of(message))
    placements, location_problem = {}, None
    try:
        placements = dict(
            resolve_locations(body.locations, content.resources, path, raw.header.body_offset)
        )
    except HeliosError as error:
        location_problem = str(error)
    prepared, contract_problem = None, None
    try:
        prepared = PreparedContract.decode(content.contract_bytes, content.manifest_bytes)
    except ContractError as error:
        contract_problem = str(error)
    return CoreInspection(
        path=os.fspath(path),
        core_format=content.core_format,
        publisher=content.publisher,
        signatures=tuple(SignatureReport(key_id.hex(), ok) for key_id, ok in reports),
        resources=tuple(entry.info for entry in content.resources),
        placements=placements,
        location_problem=location_problem,
        prepared=prepared,
        contract_problem=contract_problem,
        ignored_catalogs=content.ignored_catalogs,
    )


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

from helios.contract import PreparedContract, manifest_pb2, serving_pb2
from helios.core.body import parse_core_body, parse_payload, publisher_of, signed_content
from helios.core.envelope import MAX_SIGNATURES, signature_reports
from helios.core.errors import BadSignatureError
from helios.core.layout import read_raw_core
from helios.core.locations import resolve_locations
from helios.core.reader import core_file
from helios.core.records import CoreFormat, Placement, Publisher, ResourceInfo
from helios.core.references import check_manifest_references
from helios.errors import ContractError, HeliosError


@dataclass(frozen=True)
class SignatureReport:
    key_id: str
    is_valid: bool


@dataclass(frozen=True)
class GraphSummary:
    name: str
    operation: str
    variants: tuple[str, ...]


@dataclass(frozen=True)
class ContractSummary:
    """Serving metadata straight from the (unverified) contract bytes, valid or not."""

    served_id: str
    aliases: tuple[str, ...]
    model_version: int
    context_tokens: int
    prefill_tokens: int
    page_capacity: int
    snapshot_capacity: int
    max_concurrency: int
    speculative_widths: tuple[int, ...]
    ranks: int
    graphs: tuple[GraphSummary, ...]


def _variant(capacity) -> str:
    text = f"B{capacity.batch_capacity}xW{capacity.token_capacity}"
    if capacity.packed_token_capacity:
        text += f"/P{capacity.packed_token_capacity}"
    if capacity.draft_tokens:
        text += f"/D{capacity.draft_tokens}"
    return text


def summarize_contract(contract_bytes: bytes, manifest_bytes: bytes) -> ContractSummary:
    contract = serving_pb2.ServingContract.FromString(contract_bytes)
    manifest = manifest_pb2.ExecutionManifest.FromString(manifest_bytes)
    graphs = tuple(
        GraphSummary(
            graph.name,
            serving_pb2.GraphOperation.Name(graph.operation)
            if graph.operation in serving_pb2.GraphOperation.values()
            else str(graph.operation),
            tuple(_variant(v) for v in graph.variants),
        )
        for graph in contract.model.graphs
    )
    return ContractSummary(
        served_id=contract.served_id,
        aliases=tuple(contract.aliases),
        model_version=contract.model.version,
        context_tokens=contract.context_tokens,
        prefill_tokens=contract.prefill_tokens,
        page_capacity=contract.page_capacity,
        snapshot_capacity=contract.snapshot_capacity,
        max_concurrency=contract.max_concurrency,
        speculative_widths=tuple(contract.speculative_widths),
        ranks=manifest.ranks,
        graphs=graphs,
    )


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
    contract: ContractSummary
    prepared: PreparedContract | None
    contract_problem: str | None
    ignored_catalogs: int
    is_verified: bool = False


def inspect_core(path: os.PathLike | str) -> CoreInspection:
    """Reads a core's claims without authorization; raises CoreError if it cannot be parsed."""
    path = Path(path)
    raw = read_raw_core(path)
    body = parse_core_body(raw.body)
    if len(body.envelope.signatures) > MAX_SIGNATURES:  # each costs a verification; every reader refuses more
        raise BadSignatureError(f"more than {MAX_SIGNATURES} signatures")
    reports = signature_reports(body.format_version, body.envelope)
    message = parse_payload(body.format_version, body.envelope.payload)
    content = signed_content(body.format_version, message, publisher_of(message))
    placements, location_problem = {}, None
    try:
        placements = dict(
            resolve_locations(body.locations, content.resources, core_file(path, body.locations),
                              raw.header.body_offset)
        )
    except HeliosError as error:
        location_problem = str(error)
    prepared, contract_problem = None, None
    try:
        prepared = PreparedContract.decode(content.contract_bytes, content.manifest_bytes, servable=False)
        # The check `verify` and every loader make (exit 3): a manifest naming a resource the core
        # does not hold is no "ok" contract either.
        check_manifest_references(content)
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
        contract=summarize_contract(content.contract_bytes, content.manifest_bytes),
        prepared=prepared,
        contract_problem=contract_problem,
        ignored_catalogs=content.ignored_catalogs,
    )


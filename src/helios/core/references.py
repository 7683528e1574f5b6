"""Cross-check: every resource the execution manifest names is stored in the core, with a fitting
kind and rank. A core whose manifest points at missing resources fails at open, not at load."""

from __future__ import annotations

from helios.contract import manifest_pb2
from helios.core.body import SignedContent
from helios.core.records import ResourceKind
from helios.errors import ContractError

def check_manifest_references(content: SignedContent) -> None:
    """Raises ContractError (with the manifest field path) for a dangling resource reference."""
    manifest = manifest_pb2.ExecutionManifest.FromString(content.manifest_bytes)
    infos = {entry.id: entry.info for entry in content.resources}
    for index, buffer in enumerate(manifest.buffers):
        if not buffer.resource_id:
            continue
        path = f"manifest.buffers[{index}].resource_id"
        info = infos.get(buffer.resource_id)
        if info is None:
            raise ContractError(path, f"resource {buffer.resource_id!r} is not in the core")
        if info.kind is not ResourceKind.WEIGHTS:
            raise ContractError(path, f"resource {buffer.resource_id!r} is not a weights resource")
    for index, handle in enumerate(manifest.graph_handles):
        path = f"manifest.graph_handles[{index}].resource_id"
        info = infos.get(handle.resource_id)
        if info is None:
            raise ContractError(path, f"resource {handle.resource_id!r} is not in the core")
        if not info.kind.is_program:
            raise ContractError(path, f"resource {handle.resource_id!r} is not a program")
        if info.rank is not None and info.rank != handle.rank:
            raise ContractError(
                path, f"resource {handle.resource_id!r} belongs to rank {info.rank}"
            )

"""The complete rule set, applied in dependency order to one contract and manifest pair.

Order matters: schema-level checks (unknown fields, enum values) come first, then rules over
one document, then name indexes, then rules that join names across documents, and last what
this runtime serves (`helios.contract.servable`: a contract that validates loads). Each stage may
rely on what earlier stages established, so no rule meets a malformed input it was not written
for. The first violation raises `ContractError` with its field path.
"""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.index import ContractIndex, build_index
from helios.contract.rules import CONTRACT, MANIFEST, MODEL, require
from helios.contract.servable import check_servable
from helios.contract.validate_cross import check_cross
from helios.contract.validate_frontend import check_frontend
from helios.contract.validate_graphs import check_graphs
from helios.contract.validate_host_tables import check_host_tables
from helios.contract.validate_manifest import check_manifest
from helios.contract.validate_model import check_model
from helios.contract.validate_serving import check_serving
from helios.contract.validate_structure import check_structure
from helios.contract.validate_tuning import check_tuned_bindings


def validate(contract: spb.ServingContract, manifest: mpb.ExecutionManifest, *, servable: bool = True) -> ContractIndex:
    """Check every rule; return the name index of the (unchanged) documents.

    `servable=False` checks the specification's rules only, without the last stage (what this
    runtime serves): reading, verifying and inspecting a signed core must work for any valid core,
    and the runtime checks servability itself when it loads one (`helios.runtime.loading.model`)."""
    check_structure(contract, CONTRACT)
    check_structure(manifest, MANIFEST)
    require(contract.HasField("model"), MODEL, "model contract is required")
    check_model(contract.model)
    check_serving(contract)
    check_frontend(contract.model)
    index = build_index(contract, manifest)
    check_graphs(contract, index)
    check_manifest(manifest, index)
    check_cross(contract, manifest, index)
    check_tuned_bindings(contract.model, manifest, index)
    check_host_tables(contract.model, index)
    if servable:
        check_servable(contract, manifest)
    return index

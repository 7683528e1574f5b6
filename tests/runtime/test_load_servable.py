"""A core that is valid by the specification but declares what this runtime does not serve is read,
verified and inspected, and refused when loaded, with the field path of the first such declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.contract import serving_pb2 as spb
from helios.contract.servable import NotServableError
from helios.core.aead import load_aead_key
from helios.core.inspection import inspect_core
from helios.core.keys import TrustedKeys
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cores"


def test_a_valid_core_binding_image_tensors_whole_to_prefill_reads_and_is_refused_at_load():
    """The committed logical-resource fixture (fake programs) declares every graph operation; its
    SNAPSHOT, RESTORATION and RESUME graphs are served, its PREFILL graph's whole-image binding is not."""
    core = open_core(
        FIXTURES / "logical_v4.core",
        accept="test.helios/fixtures",
        trusted_keys=TrustedKeys.from_paths([FIXTURES / "TEST-ONLY-signing.key.pub"]),
        aes_key=load_aead_key(FIXTURES / "TEST-ONLY-aes.key"),
    )
    assert inspect_core(FIXTURES / "logical_v4.core").contract_problem is None
    with pytest.raises(NotServableError) as caught:
        load_model(core, LoadOptions(device="cpu"))
    graphs = core.prepared.contract.model.graphs
    prefill = next(i for i, g in enumerate(graphs) if g.name == "prefill")
    binding = next(j for j, b in enumerate(graphs[prefill].bindings)
                   if b.source == spb.VALUE_SOURCE_IMAGE_TENSOR and b.indexing == spb.INDEXING_SCALAR)
    assert caught.value.path == f"contract.model.graphs[{prefill}].bindings[{binding}].indexing"
    assert "IMAGE_TENSOR values are not supplied" in str(caught.value)
    served = {spb.GRAPH_OPERATION_SNAPSHOT, spb.GRAPH_OPERATION_RESTORATION, spb.GRAPH_OPERATION_RESUME}
    assert served <= {g.operation for g in graphs}

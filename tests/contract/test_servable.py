"""Every graph operation and value source of the schema is either served by this runtime or refused
with its field path before anything is loaded; the completion layout is read as declared or refused."""

from __future__ import annotations

import json

import pytest

from contract.documents import example_doc
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.servable import SERVED_OPERATIONS, SERVED_SOURCES, NotServableError, check_servable
from helios.errors import LoadError
from helios.runtime.execution import packer
from helios.runtime.service import build_runtime
from runtime.test_model_fixture import open_fixture, rewrite

OPERATIONS = [v for v in spb.GraphOperation.values() if v != spb.GRAPH_OPERATION_UNSPECIFIED]
SOURCES = [v for v in spb.ValueSource.values() if v != spb.VALUE_SOURCE_UNSPECIFIED]


def _contract(operation: int, source: int = spb.VALUE_SOURCE_SLOT) -> spb.ServingContract:
    contract = spb.ServingContract()
    graph = contract.model.graphs.add(name="g", operation=operation)
    graph.bindings.add(destination="d", source=source)
    return contract


def _manifest() -> mpb.ExecutionManifest:
    return open_fixture().prepared.manifest


def test_served_sources_are_exactly_what_shared_packing_supplies():
    supplied = (set(packer._ROW_SOURCES) | packer._PACKED_SOURCES | packer._ADMISSION_SOURCES
                | packer._COPIED_SOURCES | packer.IMAGE_SOURCES | packer._BIAS_SOURCES
                | {spb.VALUE_SOURCE_GRAMMAR_MASK, spb.VALUE_SOURCE_LIVE_ROW_COUNT, spb.VALUE_SOURCE_CONSTANT})
    assert SERVED_SOURCES == supplied


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda v: spb.GraphOperation.Name(v))
def test_every_graph_operation_is_served_or_refused_with_its_path(operation):
    contract = _contract(operation)
    if operation in SERVED_OPERATIONS:
        check_servable(contract, _manifest())
        return
    with pytest.raises(NotServableError) as caught:
        check_servable(contract, _manifest())
    assert caught.value.path == "contract.model.graphs[0].operation"
    assert isinstance(caught.value, LoadError)


@pytest.mark.parametrize("source", SOURCES, ids=lambda v: spb.ValueSource.Name(v))
def test_every_value_source_is_served_or_refused_with_its_path(source):
    contract = _contract(spb.GRAPH_OPERATION_PREFILL, source)
    contract.model.graphs[0].bindings[0].indexing = spb.INDEXING_PACKED_TOKEN  # how image tensors reach prompts
    if source in SERVED_SOURCES:
        check_servable(contract, _manifest())
        return
    with pytest.raises(NotServableError) as caught:
        check_servable(contract, _manifest())
    assert caught.value.path == "contract.model.graphs[0].bindings[0].source"


def test_image_tensors_are_whole_for_vision_graphs_and_packed_for_prompt_graphs():
    for operation, indexing, served in ((spb.GRAPH_OPERATION_VISION, spb.INDEXING_SCALAR, True),
                                        (spb.GRAPH_OPERATION_PREFILL, spb.INDEXING_SCALAR, False),
                                        (spb.GRAPH_OPERATION_VISION, spb.INDEXING_PACKED_TOKEN, False)):
        contract = _contract(operation, spb.VALUE_SOURCE_IMAGE_TENSOR)
        contract.model.graphs[0].bindings[0].indexing = indexing
        if served:
            check_servable(contract, _manifest())
            continue
        with pytest.raises(NotServableError) as caught:
            check_servable(contract, _manifest())
        assert caught.value.path == "contract.model.graphs[0].bindings[0].indexing"


def test_prepared_cores_are_servable_and_load():
    core = open_fixture()
    check_servable(core.prepared.contract, core.prepared.manifest)
    operations = {g.operation for g in core.prepared.contract.model.graphs}
    assert operations <= SERVED_OPERATIONS and spb.GRAPH_OPERATION_DECODE in operations
    build_runtime(core)


def test_example_contract_validates_but_is_refused_at_load_with_a_path():
    prepared = PreparedContract.from_json(json.dumps(example_doc()))
    with pytest.raises(NotServableError) as caught:
        check_servable(prepared.contract, prepared.manifest)
    assert caught.value.path == "contract.model.graphs[0].operation"  # the INITIALIZATION graph
    assert "INITIALIZATION" in str(caught.value)


def _move_field(kind: int, byte_offset: int):
    def edit(manifest: mpb.ExecutionManifest) -> None:
        for field in manifest.completion.fields:
            if field.kind == kind:
                field.byte_offset = byte_offset
    return edit


@pytest.mark.parametrize("kind", [mpb.COMPLETION_FIELD_KIND_EMITTED_TOKENS, mpb.COMPLETION_FIELD_KIND_SAMPLED_TOKENS])
def test_a_completion_layout_the_runtime_does_not_read_is_refused_at_load(tmp_path, kind):
    # Column 7 (the consumed endpoint) is free in the declared layout, so the schema accepts the move.
    path = rewrite(tmp_path, _move_field(kind, 7 * 8))
    index = [f.kind for f in open_fixture(path).prepared.manifest.completion.fields].index(kind)
    with pytest.raises(NotServableError) as caught:
        build_runtime(open_fixture(path))
    assert caught.value.path == f"manifest.completion.fields[{index}].byte_offset"

"""Every graph operation and value source of the schema is either served by this runtime or refused by
validation with its field path (one table, `helios.contract.servable`, read by validation and by the
packer); the completion layout is read as declared or refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.documents import example_doc, graph
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.binding_rules import ALLOWED_INDEXING, SOURCE_OPERATIONS
from helios.contract.servable import (OPERATIONS, SERVED_OPERATIONS, SOURCES, STATE_COPY_OPERATIONS,
                                      STATE_COPY_ROW_SOURCE, STATE_COPY_SOURCES, NotServableError, Refused, Served,
                                      check_servable, source_decision)
from helios.core.keys import load_signing_key
from helios.core.writer import CoreWriter
from helios.errors import ContractError, LoadError
from helios.runtime.execution import bindings
from helios.runtime.execution.image_packing import IMAGE_SOURCES
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from runtime.test_model_fixture import EXPECTED, KEY, NAMESPACE, open_fixture, rewrite

OPERATIONS_ENUM = [v for v in spb.GraphOperation.values() if v != spb.GRAPH_OPERATION_UNSPECIFIED]
SOURCES_ENUM = [v for v in spb.ValueSource.values() if v != spb.VALUE_SOURCE_UNSPECIFIED]
PAIRS = [(s, i) for s in SOURCES_ENUM for i in sorted(ALLOWED_INDEXING[s])]


def test_every_enum_value_of_the_schema_has_a_decision():
    """A new GraphOperation or ValueSource in the .proto fails here until the table decides it."""
    assert set(OPERATIONS) == set(OPERATIONS_ENUM)
    assert set(SOURCES) == set(SOURCES_ENUM) == set(ALLOWED_INDEXING)
    for source, decision in SOURCES.items():
        if isinstance(decision, Served):  # nothing served that validation would not let through
            assert decision.indexings | decision.vision <= ALLOWED_INDEXING[source], spb.ValueSource.Name(source)
        else:
            assert isinstance(decision, Refused) and decision.reason


def test_the_packer_reads_the_same_table():
    assert bindings.source_decision is source_decision


def _contract(operation: int, source: int = spb.VALUE_SOURCE_CONSTANT, indexing: int = spb.INDEXING_SCALAR):
    """One graph "g" of `operation` binding `source` first; a state-copy graph also binds its row
    source and comes with its counterpart (graphs[1]), which servable cores declare."""
    contract = spb.ServingContract()
    graph = contract.model.graphs.add(name="g", operation=operation)
    graph.bindings.add(destination="d", source=source, indexing=indexing)
    if operation in STATE_COPY_OPERATIONS:
        graph.bindings.add(destination="rows", source=STATE_COPY_ROW_SOURCE[operation],
                           indexing=spb.INDEXING_SUBMISSION_ROW)
        other = next(op for op in STATE_COPY_OPERATIONS if op != operation)
        companion = contract.model.graphs.add(name="other", operation=other)
        companion.bindings.add(destination="rows", source=STATE_COPY_ROW_SOURCE[other],
                               indexing=spb.INDEXING_SUBMISSION_ROW)
    return contract


def _manifest() -> mpb.ExecutionManifest:
    return open_fixture().prepared.manifest


@pytest.mark.parametrize("operation", OPERATIONS_ENUM, ids=lambda v: spb.GraphOperation.Name(v))
def test_every_graph_operation_is_served_or_refused_with_its_path(operation):
    contract = _contract(operation)
    if operation in SERVED_OPERATIONS:
        check_servable(contract, _manifest())
        return
    with pytest.raises(NotServableError) as caught:
        check_servable(contract, _manifest())
    assert caught.value.path == "contract.model.graphs[0].operation"
    assert isinstance(caught.value, LoadError) and isinstance(caught.value, ContractError)


def _operation_for(source: int) -> int:
    allowed = SOURCE_OPERATIONS.get(source)
    for operation in (spb.GRAPH_OPERATION_DECODE, spb.GRAPH_OPERATION_PREFILL, spb.GRAPH_OPERATION_MIXED):
        if allowed is None or operation in allowed:
            return operation
    return sorted(allowed)[0]  # RESTORE_SOURCE: RESTORATION, SNAPSHOT_DESTINATION: SNAPSHOT, ...


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{spb.ValueSource.Name(p[0])}-{spb.Indexing.Name(p[1])}")
def test_every_value_source_and_indexing_is_served_or_refused_with_its_path(pair):
    source, indexing = pair
    operation = _operation_for(source)
    contract = _contract(operation, source, indexing)
    reason = source_decision(source, indexing, operation)
    if reason is None:
        check_servable(contract, _manifest())
        bindings.resolve_bindings(_Prepared(contract), "g")  # the packer resolves exactly these
        return
    with pytest.raises(NotServableError) as caught:
        check_servable(contract, _manifest())
    field = "indexing" if isinstance(SOURCES[source], Served) else "source"
    assert caught.value.path == f"contract.model.graphs[0].bindings[0].{field}"
    with pytest.raises(bindings.UnsupportedBindingError):
        bindings.resolve_bindings(_Prepared(contract), "g")


class _Prepared:
    """The slice of `PreparedContract` that `bindings.resolve_bindings` reads, over a bare contract."""

    def __init__(self, contract: spb.ServingContract):
        self.graphs = {"g": _Graph(contract.model.graphs[0])}
        self.contract, self.manifest = contract, _manifest()


class _Graph:
    def __init__(self, graph: spb.GraphContract):
        self.operation = graph.operation
        self.bindings = [_View(b) for b in graph.bindings]


class _View:
    def __init__(self, binding: spb.ValueBinding):
        self.destination, self.buffer, self.source, self.indexing = (binding.destination, "b", binding.source,
                                                                     binding.indexing)
        self.offset, self.padding, self.constant, self.image_output = (binding.offset, binding.padding,
                                                                       binding.constant, binding.image_output)
        self.host_table = binding.host_table


def test_image_tensors_are_whole_for_vision_graphs_and_packed_for_prompt_graphs():
    for operation, indexing, served in ((spb.GRAPH_OPERATION_VISION, spb.INDEXING_SCALAR, True),
                                        (spb.GRAPH_OPERATION_PREFILL, spb.INDEXING_SCALAR, False),
                                        (spb.GRAPH_OPERATION_VISION, spb.INDEXING_PACKED_TOKEN, False)):
        contract = _contract(operation, spb.VALUE_SOURCE_IMAGE_TENSOR, indexing)
        if served:
            check_servable(contract, _manifest())
            continue
        with pytest.raises(NotServableError) as caught:
            check_servable(contract, _manifest())
        assert caught.value.path == "contract.model.graphs[0].bindings[0].indexing"


def test_the_example_contract_validates_so_it_is_servable():
    prepared = PreparedContract.from_json(json.dumps(example_doc()))
    check_servable(prepared.contract, prepared.manifest)


def _as_snapshot_graph(doc: dict, name: str) -> str:
    """Turns graph `name` of the example into a SNAPSHOT graph the specification's rules accept
    (only sources a state copy takes); returns its path."""
    entry, path = graph(doc, name)
    entry["operation"] = "GRAPH_OPERATION_SNAPSHOT"
    keep = {spb.ValueSource.Name(s) for s in STATE_COPY_SOURCES}
    entry["bindings"] = [b for b in entry["bindings"] if b["source"] in keep]
    for item in doc["manifest"]["execution_catalog"]:
        if item["graph"] == name:
            item["operation"] = "GRAPH_OPERATION_SNAPSHOT"
    return path


def test_validation_refuses_a_snapshot_graph_without_a_restoration_graph_with_its_path():
    doc = example_doc()
    path = _as_snapshot_graph(doc, "score_prefill")
    with pytest.raises(NotServableError) as caught:
        PreparedContract.from_json(json.dumps(doc))
    assert caught.value.path == f"{path}.operation"
    assert "also declares a RESTORATION graph" in str(caught.value)


@pytest.mark.parametrize("operation", sorted(STATE_COPY_OPERATIONS), ids=lambda v: spb.GraphOperation.Name(v))
def test_a_state_copy_graph_without_its_row_source_is_refused_with_its_path(operation):
    contract = _contract(operation)
    del contract.model.graphs[0].bindings[1]  # the row source
    with pytest.raises(NotServableError) as caught:
        check_servable(contract, _manifest())
    assert caught.value.path == "contract.model.graphs[0].bindings"


@pytest.mark.parametrize("operation", sorted(STATE_COPY_OPERATIONS), ids=lambda v: spb.GraphOperation.Name(v))
def test_state_copy_graphs_are_supplied_only_what_a_state_copy_has(operation):
    """A SNAPSHOT or RESTORATION graph holds no request lane: only STATE_COPY_SOURCES reach it; any
    other source is refused with the binding's source path (and by the packer)."""
    for source, indexing in PAIRS:
        contract = _contract(operation, source, indexing)
        if source in STATE_COPY_SOURCES and source_decision(source, indexing, operation) is None:
            check_servable(contract, _manifest())
            continue
        with pytest.raises(NotServableError) as caught:
            check_servable(contract, _manifest())
        field = "source" if source not in STATE_COPY_SOURCES else "indexing"
        assert caught.value.path == f"contract.model.graphs[0].bindings[0].{field}", spb.ValueSource.Name(source)


def test_validation_refuses_an_unserved_indexing_with_its_path():
    doc = example_doc()
    prefill, path = graph(doc, "prefill")
    index = next(i for i, b in enumerate(prefill["bindings"]) if b["source"] == "VALUE_SOURCE_PROMPT_HISTOGRAM")
    prefill["bindings"][index]["indexing"] = "INDEXING_SUBMISSION_ROW"  # valid, but histograms are per slot
    with pytest.raises(NotServableError) as caught:
        PreparedContract.from_json(json.dumps(doc))
    assert caught.value.path == f"{path}.bindings[{index}].indexing"


def test_prepared_cores_are_servable_and_load():
    core = open_fixture()
    operations = {g.operation for g in core.prepared.contract.model.graphs}
    assert operations <= SERVED_OPERATIONS and spb.GRAPH_OPERATION_DECODE in operations
    build_runtime(core)


def _move_field(kind: int, byte_offset: int):
    def edit(manifest: mpb.ExecutionManifest) -> None:
        for field in manifest.completion.fields:
            if field.kind == kind:
                field.byte_offset = byte_offset
    return edit


@pytest.mark.parametrize("kind", [mpb.COMPLETION_FIELD_KIND_EMITTED_TOKENS, mpb.COMPLETION_FIELD_KIND_SAMPLED_TOKENS])
def test_a_completion_layout_the_runtime_does_not_read_is_refused_with_its_path(tmp_path, kind):
    # Column 7 (the consumed endpoint) is free in the declared layout, so the schema's own rules accept the move.
    index = [f.kind for f in open_fixture().prepared.manifest.completion.fields].index(kind)
    with pytest.raises(NotServableError) as caught:
        rewrite(tmp_path, _move_field(kind, 7 * 8))
    assert caught.value.path == f"manifest.completion.fields[{index}].byte_offset"


# --- a core binding every value source the fixture's graphs can take, loaded and served --------------

# PAGE_TABLE is already bound to the fixture's page-table view; HOST_TABLE_ROWS needs a declared host
# table (tests/runtime/test_host_staging.py loads and serves an Engram core).
_TEXT_ONLY = {spb.VALUE_SOURCE_PAGE_TABLE, spb.VALUE_SOURCE_HOST_TABLE_ROWS}
_FLOAT = {spb.VALUE_SOURCE_SAMPLING_PARAMETERS: 7, spb.VALUE_SOURCE_LOGIT_BIAS_VALUES: 300}
_WIDTH = {spb.VALUE_SOURCE_EOS_IDS: 4, spb.VALUE_SOURCE_SEED_BITS: 0, spb.VALUE_SOURCE_PROMPT_HISTOGRAM: 320,
          spb.VALUE_SOURCE_GRAMMAR_MASK: 10, spb.VALUE_SOURCE_LOGIT_BIAS_IDS: 300}
_GRAPHS = {spb.GRAPH_OPERATION_DECODE: "decode", spb.GRAPH_OPERATION_PREFILL: "prefill",
           spb.GRAPH_OPERATION_MIXED: "mixed"}


def _fixture_pairs() -> list[tuple[int, int, str]]:
    """(source, indexing, graph) of every served pair a text-only PREFILL/DECODE/MIXED core can bind."""
    out = []
    for source, indexing in PAIRS:
        if source in _TEXT_ONLY or indexing not in (SOURCES[source].indexings if isinstance(SOURCES[source], Served)
                                                    else ()):
            continue
        allowed = SOURCE_OPERATIONS.get(source, set(_GRAPHS))
        for operation, name in _GRAPHS.items():
            if operation in allowed and not (source in IMAGE_SOURCES):
                out.append((source, indexing, name))
                break
    return out


def _add_binding(contract, manifest, source: int, indexing: int, graph_name: str) -> str:
    name = f"x.{spb.ValueSource.Name(source)[13:].lower()}.{spb.Indexing.Name(indexing)[9:].lower()}"
    rows = {spb.INDEXING_SCALAR: 1, spb.INDEXING_PACKED_TOKEN: 20}.get(indexing, 4)
    buffer = manifest.buffers.add(name=name, placement=mpb.PLACEMENT_HOST, role=mpb.BUFFER_ROLE_INPUT)
    buffer.dtype = mpb.DTYPE_FLOAT32 if source in _FLOAT else (
        mpb.DTYPE_INT64 if source in (spb.VALUE_SOURCE_SEED_BITS, spb.VALUE_SOURCE_LOGIT_BIAS_IDS) else mpb.DTYPE_INT32)
    buffer.shape.add(size=rows)
    width = _FLOAT.get(source) or _WIDTH.get(source)
    if width:
        buffer.shape.add(size=width)
    manifest.destinations.add(name=name, buffer=name)
    graph = next(g for g in contract.model.graphs if g.name == graph_name)
    graph.bindings.add(destination=name, source=source, indexing=indexing, padding=-7,
                       constant=5 if source == spb.VALUE_SOURCE_CONSTANT else 0)
    return name


def test_a_core_binding_every_servable_source_loads_and_serves(tmp_path):
    pairs = _fixture_pairs()
    covered = {source for source, _, _ in pairs}
    # Sources only SPECULATIVE, SCORED_PREFILL or image-taking graphs receive are packed in
    # tests/runtime/test_packer_sources.py over the example contract.
    assert covered >= {spb.VALUE_SOURCE_EOS_IDS, spb.VALUE_SOURCE_INACTIVE_PADDING, spb.VALUE_SOURCE_LIVE_STATE_ROWS,
                       spb.VALUE_SOURCE_MIXED_PREFILL_ROW, spb.VALUE_SOURCE_SAMPLING_DECISION}
    source_core = open_fixture()
    contract_bytes, manifest_bytes = source_core.prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    names = {(s, i): _add_binding(contract, manifest, s, i, g) for s, i, g in pairs}
    path = _write(tmp_path, source_core, contract, manifest)
    runtime = build_runtime(open_fixture(path))
    results = generate(runtime.engine, EXPECTED["prompts"], EXPECTED["max_tokens"], eos_ids=[96])
    assert [list(r.token_ids)[:1] for r in results] == [t[:1] for t in EXPECTED["token_ids"]]
    buffers = runtime.model.buffers
    eos = buffers[names[(spb.VALUE_SOURCE_EOS_IDS, spb.INDEXING_PHYSICAL_REQUEST_ROW)]]
    assert eos[0].tolist() == [96, -7, -7, -7]  # admitted slots hold the request's EOS ids, padded
    padding = buffers[names[(spb.VALUE_SOURCE_INACTIVE_PADDING, spb.INDEXING_SUBMISSION_ROW)]]
    assert padding.tolist() == [-7] * 4
    state_rows = buffers[names[(spb.VALUE_SOURCE_LIVE_STATE_ROWS, spb.INDEXING_SUBMISSION_ROW)]]
    assert state_rows.min() >= -7 and state_rows.max() < runtime.model.num_state_rows


def _write(tmp_path: Path, source, contract, manifest) -> Path:
    writer = CoreWriter()
    for info in source.resources:
        writer.add_resource(info.id, info.kind, source.read_resource(info.id), rank=info.rank)
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(NAMESPACE)
    writer.add_signing_key(load_signing_key(KEY))
    target = tmp_path / "bound.core"
    writer.write(target)
    return target


# Where a core holding graphs of each served operation is loaded and served; a newly served
# operation needs an entry (and that test), a refused one is shown refused above.
LOADED_BY = {
    spb.GRAPH_OPERATION_PREFILL: "runtime/test_model_fixture.py",
    spb.GRAPH_OPERATION_DECODE: "runtime/test_model_fixture.py",
    spb.GRAPH_OPERATION_MIXED: "runtime/test_model_fixture.py",
    spb.GRAPH_OPERATION_TUNING: "runtime/test_startup_tuning.py",
    spb.GRAPH_OPERATION_SCORED_PREFILL: "server/test_prompt_scores.py",
    spb.GRAPH_OPERATION_SPECULATIVE: "speculative/test_prepared_core.py",
    spb.GRAPH_OPERATION_VISION: "vision/test_vl_equivalence.py",
    spb.GRAPH_OPERATION_INITIALIZATION: "runtime/test_initialization.py",
    spb.GRAPH_OPERATION_SNAPSHOT: "runtime/test_state_graphs.py",
    spb.GRAPH_OPERATION_RESTORATION: "runtime/test_state_graphs.py",
    spb.GRAPH_OPERATION_RESUME: "runtime/test_state_graphs.py",
}


def test_every_served_operation_has_a_test_that_loads_a_core_with_it():
    tests = Path(__file__).resolve().parents[1]
    assert set(LOADED_BY) == SERVED_OPERATIONS
    for operation, name in LOADED_BY.items():
        assert (tests / name).is_file(), name


# Where a core binding each served source that the fixture-pairs core above cannot bind is loaded and
# served (a newly served source needs an entry or a place in that core).
SOURCE_LOADED_BY = {
    spb.VALUE_SOURCE_PAGE_TABLE: "runtime/test_model_fixture.py",
    spb.VALUE_SOURCE_HOST_TABLE_ROWS: "runtime/test_host_staging.py",
    spb.VALUE_SOURCE_SCORED_TARGET_TOKENS: "server/test_prompt_scores.py",
    spb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: "speculative/test_prepared_core.py",
    spb.VALUE_SOURCE_COPIED_CANDIDATE_IDS: "speculative/test_prepared_core.py",
    spb.VALUE_SOURCE_COPIED_CANDIDATE_COUNT: "speculative/test_prepared_core.py",
    spb.VALUE_SOURCE_COPIED_GENERATION: "speculative/test_prepared_core.py",
    spb.VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT: "speculative/test_prepared_core.py",
    spb.VALUE_SOURCE_COPIED_GRAMMAR_MASKS: "speculative/test_prepared_core.py",
    spb.VALUE_SOURCE_IMAGE_FEATURE_INDICES: "vision/test_vl_equivalence.py",
    spb.VALUE_SOURCE_IMAGE_CONTEXT_INDICES: "vision/test_vl_equivalence.py",
    spb.VALUE_SOURCE_IMAGE_FEATURE_SLOT: "vision/test_vl_equivalence.py",
    spb.VALUE_SOURCE_IMAGE_TENSOR: "vision/test_vl_equivalence.py",
    spb.VALUE_SOURCE_RESTORE_SOURCE: "runtime/test_state_graphs.py",
    spb.VALUE_SOURCE_SNAPSHOT_DESTINATION: "runtime/test_state_graphs.py",
}


def test_every_served_source_has_a_test_that_loads_a_core_binding_it():
    tests = Path(__file__).resolve().parents[1]
    served = {source for source, decision in SOURCES.items() if isinstance(decision, Served)}
    bound_here = {source for source, _, _ in _fixture_pairs()}
    assert served == bound_here | set(SOURCE_LOADED_BY) and not bound_here & set(SOURCE_LOADED_BY)
    for source, name in SOURCE_LOADED_BY.items():
        assert (tests / name).is_file(), name

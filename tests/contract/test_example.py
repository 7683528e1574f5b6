"""The bundled example (examples/contract.json): it is valid, canonical, round-trips through
every encoding unchanged, exercises every message and enum, and versions 1 and 2 decode.
"""

from __future__ import annotations

import json

import pytest
from google.protobuf.descriptor import FieldDescriptor

from contract.documents import decode_doc, example_text, version_1_doc, version_2_doc
from helios.contract import EXPORTED_VERSION, PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.servable import OPERATIONS, SOURCES, Refused
from helios.errors import ContractError


def _refused(enum_type, table) -> set[str]:
    prefix = enum_type.DESCRIPTOR.values[0].name[: -len("UNSPECIFIED")]
    return {enum_type.Name(v)[len(prefix):] for v, decision in table.items() if isinstance(decision, Refused)}


# Served state copies and resumes the example does not declare yet: a core declaring them (and binding
# their row sources) is loaded and served in tests/runtime/test_state_graphs.py. The example is being
# rebuilt into a servable core; when it declares SNAPSHOT, RESTORATION and RESUME graphs again, these go.
NOT_YET_IN_EXAMPLE = {
    "GraphOperation": {"SNAPSHOT", "RESTORATION", "RESUME"},
    "ValueSource": {"RESTORE_SOURCE", "SNAPSHOT_DESTINATION"},
}
# Frontend selectors are mutually exclusive within one contract; graph operations and value sources
# this runtime refuses (helios.contract.servable) cannot appear in a valid contract; every other
# enum value appears.
EXCLUSIVE_VALUES = {
    "GraphOperation": _refused(spb.GraphOperation, OPERATIONS) | NOT_YET_IN_EXAMPLE["GraphOperation"],
    "ValueSource": _refused(spb.ValueSource, SOURCES) | NOT_YET_IN_EXAMPLE["ValueSource"],
    "ToolParser": {"NONE", "GLM_ARGUMENT_TAGS", "DSML", "XTML", "ATEM_RECIPIENT", "JSON_CALLS", "HARMONY_CHANNELS"},
    "ReasoningParser": {"NONE", "XTML_THINK", "RECIPIENT_HEADER", "HARMONY_CHANNELS"},
    "ImagePreparation": {"NONE", "TILE_GRID"},
    "ImageLayout": {"NONE", "ROW_SEPARATED_GRID", "SPATIAL_POSITIONS_3D"},
    "SeedPolicy": {"FIXED"},
    "HistoryKind": {"PAGED_LATENT", "SLIDING_WINDOW", "RECURRENT"},
    # Sizes only a sliding-window region's own pages (the example has no sliding region).
    "LoadExtent": {"WINDOW_PAGES"},
}


@pytest.fixture(scope="module")
def prepared() -> PreparedContract:
    return PreparedContract.from_json(example_text())


def test_round_trip_bytes_object_json_object_bytes(prepared):
    contract_bytes, manifest_bytes = prepared.encode()
    decoded = PreparedContract.decode(contract_bytes, manifest_bytes)
    again = PreparedContract.from_json(decoded.to_json())
    assert again.encode() == (contract_bytes, manifest_bytes)
    assert again == decoded
    assert decoded.to_json() == example_text()


def test_bundle_round_trip(prepared):
    restored = PreparedContract.from_bundle(prepared.to_bundle())
    assert restored.encode() == prepared.encode()


def test_exporter_version(prepared):
    assert prepared.version == EXPORTED_VERSION == 3


def _walk(message, seen_messages: set, seen_enums: dict) -> None:
    seen_messages.add(message.DESCRIPTOR.full_name)
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                _walk(item, seen_messages, seen_enums)
            elif field.type == FieldDescriptor.TYPE_ENUM:
                seen_enums.setdefault(field.enum_type.name, set()).add(field.enum_type.values_by_number[item].name)


def test_example_exercises_every_message_and_enum(prepared):
    messages: set[str] = set()
    enums: dict[str, set[str]] = {}
    _walk(prepared.contract, messages, enums)
    _walk(prepared.manifest, messages, enums)
    declared = set()
    for module in (spb, mpb):
        declared |= {m.full_name for m in module.DESCRIPTOR.message_types_by_name.values()}
    # ChannelSyntax belongs to the harmony parsers only (exclusive of the example's selectors).
    assert declared - messages == {"helios.contract.PreparedContractBundle", "helios.contract.ChannelSyntax"}
    for module in (spb, mpb):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            prefix = enum.values[0].name[: -len("UNSPECIFIED")]
            expected = {v.name for v in enum.values[1:]}
            missing = {name[len(prefix):] for name in expected - enums.get(enum.name, set())}
            assert missing == EXCLUSIVE_VALUES.get(enum.name, set()), enum.name


@pytest.mark.parametrize("build", [version_1_doc, version_2_doc], ids=["v1", "v2"])
def test_older_versions_decode(build):
    prepared = decode_doc(build())
    contract_bytes, manifest_bytes = prepared.encode()
    assert PreparedContract.decode(contract_bytes, manifest_bytes) == prepared
    assert prepared.version in (1, 2)


def test_version_1_input_range_is_the_sampled_range():
    prepared = decode_doc(version_1_doc())
    assert prepared.input_range == prepared.sampled_range == (0, 128256)


def test_views(prepared):
    decode = prepared.graphs["decode"]
    assert decode.operation == spb.GRAPH_OPERATION_DECODE and decode.operation_name == "DECODE"
    assert [v.batch_capacity for v in decode.variants] == [1, 8, 32, 64]
    assert decode.pending_token_view == "pending_token" and decode.draft_cursor == "draft"
    assert decode.tuned_buffers == {"tuning.attention_splits": "tune_attention"}
    assert "in.page_table" in decode.input_buffers and "in.prompt_tokens" not in decode.input_buffers
    confident = prepared.graphs["speculate_confident"]
    assert confident.length_source == spb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT and confident.has_copied_inputs
    assert prepared.graphs["speculate_w1"].length_source == spb.VALUE_SOURCE_QUERY_LENGTH
    assert not prepared.graphs["speculate_w1"].has_copied_inputs
    keys = prepared.buffers["cache.keys"]
    assert keys.shape == (32, "PHYSICAL_PAGES", 64, 8, 128)
    assert keys.nbytes({"PHYSICAL_PAGES": 10}) == 2 * 32 * 10 * 64 * 8 * 128
    with pytest.raises(KeyError):
        keys.nbytes()
    assert prepared.destinations["page_table"] == "in.page_table"
    assert prepared.state_rows_per_request() == 2
    assert prepared.state_rows_per_request(["decode", "prefill"]) == 1
    assert [g.name for g in prepared.graphs_for(spb.GRAPH_OPERATION_SPECULATIVE)] == [
        "speculate_w1", "speculate_w4", "speculate_confident"
    ]


def test_prepared_contract_is_immutable_and_owns_its_messages(prepared):
    with pytest.raises(AttributeError):
        prepared.version = 2
    with pytest.raises(TypeError):
        prepared.graphs["x"] = None
    own_contract, own_manifest = spb.ServingContract(), mpb.ExecutionManifest()
    own_contract.CopyFrom(prepared.contract)
    own_manifest.CopyFrom(prepared.manifest)
    mine = PreparedContract.from_messages(own_contract, own_manifest)
    own_contract.served_id = "changed"
    own_manifest.buffers[0].name = "changed"
    assert mine.contract.served_id == prepared.contract.served_id
    assert mine.manifest == prepared.manifest
    assert mine.encode() == prepared.encode()


def test_unknown_binary_field_is_rejected(prepared):
    contract_bytes, manifest_bytes = prepared.encode()
    extra = contract_bytes + bytes([0xA8, 0x06, 0x01])  # field 101, varint 1
    with pytest.raises(ContractError) as caught:
        PreparedContract.decode(extra, manifest_bytes)
    assert caught.value.path == "contract"


def test_unknown_binary_enum_number_is_rejected(prepared):
    contract = spb.ServingContract()
    contract.CopyFrom(prepared.contract)
    contract.model.graphs[3].bindings[2].source = 77
    with pytest.raises(ContractError) as caught:
        PreparedContract.decode(contract.SerializeToString(), prepared.encode()[1])
    assert caught.value.path == "contract.model.graphs[3].bindings[2].source"


def test_undecodable_bytes_are_rejected():
    with pytest.raises(ContractError) as caught:
        PreparedContract.decode(b"\xff\xff\xff", b"")
    assert caught.value.path == "contract"


@pytest.mark.parametrize("text", ["", "[]", "{", '{"contract": {}}', "\"x\""])
def test_malformed_json_documents(text):
    with pytest.raises(ContractError):
        PreparedContract.from_json(text)


def test_json_is_canonical_on_disk():
    document = json.loads(example_text())
    assert list(document) == ["contract", "manifest"]
    assert example_text().endswith("}\n")


def test_a_pending_token_both_host_fed_and_device_owned_is_valid_when_the_graph_writes_the_view():
    """The prepared cores' DECODE: PENDING_TOKEN bound (the host's token where it has one) and a
    pending_token_view it reads and writes (the token of a second execution frame)."""
    from contract.cases_graphs import add_binding
    from contract.documents import access, example_doc

    doc = example_doc()
    entry, _ = access(doc, "decode", "pending_token")
    assert entry["mode"] == "ACCESS_MODE_READ_WRITE"
    add_binding(doc, "decode", "pending_tokens", "PENDING_TOKEN", "ACTIVE_ROW")
    prepared = decode_doc(doc)
    assert prepared.graphs["decode"].pending_token_view == "pending_token"

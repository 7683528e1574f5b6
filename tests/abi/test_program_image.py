"""Program images: programs stored as graph JSON plus safetensors, loaded with no unpickling, and
crafted images (code in the graph, pickles in the tensors) refused with typed errors."""

from __future__ import annotations

import io
import json
import pickle

import pytest
import torch

import helios.abi  # noqa: F401  (registers the helios ops)
from helios.abi.program_graph import ForbiddenProgramError, check_expression
from helios.abi.program_image import (
    PickledProgramError, ProgramEncodingError, UnreadableProgramError, decode_program, encode_program,
    read_program_image,
)
from helios.abi.registry import serialized_program_ops
from helios.contract import core_pb2
from helios.errors import LoadError
from support.no_unpickling import Unpickled, no_unpickling


class _Stateful(torch.nn.Module):
    """A parameter, a buffer, a non-persistent buffer, a lifted constant and a helios op."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(4.0))
        self.register_buffer("bias", torch.full((4,), 0.5))
        self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)

    def forward(self, x, seeds, counters):
        noise = torch.ops.helios.philox_uniform(seeds, counters, 0)
        return (x * self.weight + self.bias) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0]), noise


def _inputs():
    return torch.ones(4), torch.arange(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)


@pytest.fixture(scope="module")
def exported():
    return torch.export.export(_Stateful(), _inputs(), strict=False)


@pytest.fixture(scope="module")
def image(exported) -> bytes:
    return encode_program(exported)


def test_round_trip_keeps_tensors_and_custom_ops_and_unpickles_nothing(exported, image):
    with no_unpickling():
        program = decode_program(image)
        got = program.module()(*_inputs())
    want = exported.module()(*_inputs())
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert set(program.state_dict) == {"weight", "bias"} and isinstance(program.state_dict["weight"], torch.nn.Parameter)
    assert set(program.constants) == set(exported.constants)
    assert serialized_program_ops(image) == {"helios::philox_uniform"}


def test_the_check_finds_the_operator_names_the_registry_reads(image):
    """`read_program_image`'s check walks the graph once and keeps the operator names it found; the
    registry reads a program's ABI ops from them instead of walking the graph again."""
    from helios.abi.program_graph import graph_targets
    from helios.abi.program_image import read_program_image

    read = read_program_image(image)
    assert read.targets == frozenset(graph_targets(read.graph))
    assert "torch.ops.helios.philox_uniform.default" in read.targets
    assert any(target.startswith("torch.ops.aten.") for target in read.targets)
    assert serialized_program_ops(read) == serialized_program_ops(read.graph) == serialized_program_ops(image) \
        == {"helios::philox_uniform"}


def test_image_holds_no_pickle_and_no_metadata(image):
    message = core_pb2.ProgramImage.FromString(image)
    assert message.version == 1
    assert message.state_dict[:8] != b"PK\x03\x04" and b"\x80\x02" not in message.state_dict[:2]
    graph = json.loads(message.exported_program)
    assert graph["guards_code"] == []
    assert all(node["metadata"] == {} for node in graph["graph_module"]["graph"]["nodes"])


def test_the_patches_do_catch_unpickling(exported):
    """The guard is real: torch.export.save archives with tensors unpickle when loaded."""
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    with no_unpickling(), pytest.raises(Unpickled):
        torch.export.load(io.BytesIO(buffer.getvalue()))


def test_non_tensor_constants_cannot_be_encoded(exported):
    program = torch.export.export(_Stateful(), _inputs(), strict=False)
    program.constants["opaque"] = object()
    with pytest.raises(ProgramEncodingError, match="opaque"):
        encode_program(program)


def _edited(image: bytes, edit) -> bytes:
    message = core_pb2.ProgramImage.FromString(image)
    graph = json.loads(message.exported_program)
    edit(graph)
    message.exported_program = json.dumps(graph).encode()
    return message.SerializeToString()


def _nodes(graph):
    return graph["graph_module"]["graph"]["nodes"]


def _retarget(target):
    def edit(graph):
        _nodes(graph)[0]["target"] = target
    return edit


def _set_expression(graph):
    for value in graph["graph_module"]["graph"]["tensor_values"].values():
        value["sizes"][0] = {"as_expr": {"expr_str": "__import__('os').system('echo owned')", "hint": None}}
        return


def _custom_object(graph):
    _nodes(graph)[0]["inputs"][0]["arg"] = {"as_custom_obj": {"name": "obj", "class_fqn": "os.system"}}


CRAFTED = {
    "callable reachable from torch": _retarget("torch.os.system"),
    "builtin": _retarget("builtins.eval"),
    "aten op that writes files": _retarget("torch.ops.aten.save.default"),
    "not an op overload": _retarget("torch.ops.aten.__class__.default"),
    "extension operator": _retarget("#custom:op"),
    "symbolic expression with code": _set_expression,
    "guard code": lambda graph: graph.__setitem__("guards_code", ["__import__('os').system('x')"]),
    "custom object": _custom_object,
    "unknown top-level field": lambda graph: graph.__setitem__("payload", "x"),
    "odd node metadata": lambda graph: _nodes(graph)[0].__setitem__("metadata", {"custom": {"a": 1}}),
    "range constraint name": lambda graph: graph["range_constraints"].__setitem__("__import__", {}),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_graphs_are_refused_before_torch_sees_them(image, name):
    crafted = _edited(image, CRAFTED[name])
    with no_unpickling(), pytest.raises(ForbiddenProgramError) as raised:
        decode_program(crafted)
    assert isinstance(raised.value, LoadError)


def test_pickles_anywhere_in_an_image_are_refused_unread(image, exported):
    buffer = io.BytesIO()
    torch.save({"weight": torch.ones(4)}, buffer)
    message = core_pb2.ProgramImage.FromString(image)
    message.state_dict = buffer.getvalue()
    with no_unpickling(), pytest.raises(UnreadableProgramError, match="safetensors"):
        decode_program(message.SerializeToString())
    message = core_pb2.ProgramImage.FromString(image)
    message.exported_program = pickle.dumps({"graph_module": None})
    with no_unpickling(), pytest.raises(UnreadableProgramError, match="not JSON"):
        decode_program(message.SerializeToString())
    with no_unpickling(), pytest.raises(UnreadableProgramError):
        decode_program(pickle.dumps(exported.constants))
    archive = io.BytesIO()
    torch.export.save(exported, archive)
    with no_unpickling(), pytest.raises(PickledProgramError):
        read_program_image(archive.getvalue())


def test_a_graph_torch_cannot_build_is_a_typed_error(image):
    def edit(graph):
        graph["graph_module"]["graph"]["nodes"][0]["inputs"] = [{"name": "x", "arg": {"as_tensor": {"name": "nope"}}}]
    with pytest.raises(UnreadableProgramError, match="torch cannot build"):
        decode_program(_edited(image, edit))


@pytest.mark.parametrize("expression", [
    "s0", "512*s0", "s2 - 1", "Add(Symbol('s2', positive=True, integer=True), Integer(-1))",
    "Mul(Integer(512), Symbol('s0', positive=True, integer=True))", "FloorDiv(s0, 4)", "Max(1, s0)", "-s1 + 2*s0",
])
def test_symbolic_expressions_torch_writes_are_accepted(expression):
    check_expression(expression)


@pytest.mark.parametrize("expression", [
    "s0.__class__", "__import__('os')", "exec", "lambda: 1", "getattr(s0, 'x')", "Symbol('os')", "s0[0]",
    "Symbol(\"s0\")", "x" * 5000,
])
def test_other_expressions_are_refused(expression):
    with pytest.raises(ForbiddenProgramError):
        check_expression(expression)


def test_schema_objects_equal_what_torch_builds(image):
    """`schema_object` (cached type hints) is torch's own ``_dict_to_dataclass``, faster: the same
    schema objects for this image and for a fixture core's program with symbolic shapes."""
    from pathlib import Path

    from torch._export.serde import schema
    from torch._export.serde.serialize import _dict_to_dataclass

    from helios.abi.program_image import schema_object
    from helios.core.reader import open_core

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    core = open_core(fixtures / "models" / "tiny_qwen3.core", accept="test.helios/fixtures",
                     trusted_keys=[fixtures / "cores" / "TEST-ONLY-signing.key.pub"])
    for data in (image, core.read_resource("program.mixed.r4t20.rank0")):
        graph = read_program_image(data).graph
        assert schema_object(schema.ExportedProgram, graph) == _dict_to_dataclass(schema.ExportedProgram, graph)


def test_encoding_is_the_same_with_torch_2_11s_serializer_and_leaves_torchs_canonical_form_in_place(
        exported, image, monkeypatch):
    """Encoding skips torch's canonical-form check and, where torch's serialize takes the arguments (2.13),
    the tensors' pickles; torch 2.11's serialize takes none of them, and the bytes are the same."""
    from torch._export.serde import serialize as serde

    canonicalize, serialize = serde.canonicalize, serde.serialize
    seen = []

    def serialize_2_11(exported_program, opset_version=None, pickle_protocol=serde.DEFAULT_PICKLE_PROTOCOL):
        seen.append(serde.canonicalize is canonicalize)
        return serialize(exported_program, opset_version, pickle_protocol)

    monkeypatch.setattr(serde, "serialize", serialize_2_11)
    assert encode_program(exported) == image
    assert seen == [False] and serde.canonicalize is canonicalize

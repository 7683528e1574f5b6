"""Modules built straight from a program image's graph JSON (`helios.runtime.loading.graph_image`)
are torch's: every node (op, target, name, arguments) and the in/out specs equal what
``deserialize_program(...).module()`` builds, and they compute the same outputs; what the builder
does not know is left to torch (`NotDirect`), and loading then takes torch's path."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from helios.abi.program_image import deserialize_program, read_program_image
from helios.abi.registry import registered_schemas
from helios.core.reader import open_core
from helios.runtime.loading.cuda_graphs import greedy_module
from helios.runtime.loading.graph_image import NotDirect, build_module
from helios.runtime.loading.model import DeclaredOps, load_model, program_arguments
from helios.runtime.loading.programs import load_program
from helios.runtime.loading.tuning import producer_handles

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SERVING = ["program.decode.r1t1.rank0", "program.decode.r4t4.rank0", "program.prefill.r1t16.rank0",
           "program.mixed.r4t20.rank0"]


@pytest.fixture(scope="module")
def core():
    return open_core(FIXTURES / "models" / "tiny_qwen3.core", accept="test.helios/fixtures",
                     trusted_keys=[FIXTURES / "cores" / "TEST-ONLY-signing.key.pub"])


def _nodes(module):
    def named(value):
        return torch.fx.node.map_aggregate(value, lambda a: ("node", a.name) if isinstance(a, torch.fx.Node) else a)
    return [(n.op, n.target, n.name, named(n.args), named(n.kwargs)) for n in module.graph.nodes]


@pytest.mark.parametrize("name", SERVING)
def test_direct_modules_have_torchs_nodes_and_specs(core, name):
    image = read_program_image(core.read_resource(name))
    reference = deserialize_program(image).module()
    direct = build_module(image.graph, image.state_dict, image.constants)
    assert _nodes(direct.module) == _nodes(reference) and len(_nodes(reference)) > 250
    assert direct.module._in_spec == reference._in_spec and direct.module._out_spec == reference._out_spec
    placeholders = [n for n in reference.graph.nodes if n.op == "placeholder"]
    assert direct.input_shapes == tuple(tuple(d if isinstance(d, int) else None for d in n.meta["val"].shape)
                                        for n in placeholders)


@pytest.mark.parametrize("name", SERVING)
def test_each_node_value_is_torchs_metadata_one_tensor_per_shape(core, name):
    """Every node's value has the shape, strides and dtype torch's module records for it; nodes alike
    (every layer's) share one meta tensor instead of making one each."""
    image = read_program_image(core.read_resource(name))
    reference = {n.name: n.meta.get("val") for n in deserialize_program(image).module().graph.nodes}
    direct = build_module(image.graph, image.state_dict, image.constants).module
    values = [n.meta["val"] for n in direct.graph.nodes if "val" in n.meta]
    assert len(values) > 200
    for node in direct.graph.nodes:
        if "val" in node.meta:
            value, expected = node.meta["val"], reference[node.name]
            assert value.device.type == "meta"
            assert (tuple(value.shape), value.stride(), value.dtype) == \
                (tuple(expected.shape), expected.stride(), expected.dtype)
    assert len({id(v) for v in values}) == len({(tuple(v.shape), v.stride(), v.dtype) for v in values}) < len(values)


def test_direct_modules_compute_torchs_outputs(core):
    model = load_model(core)
    for program, name in zip(model.programs, SERVING):
        image = read_program_image(core.read_resource(name))
        reference = deserialize_program(image).module()
        direct = build_module(image.graph, image.state_dict, image.constants).module
        arguments = program_arguments(program, model.weights, model.buffers)
        for module in (reference, direct):
            module.validate_inputs = False
        buffers = [copy.deepcopy(arguments) for _ in range(2)]  # each call writes its own caches
        expected = reference(*buffers[0])
        got = direct(*buffers[1])
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
        assert all(torch.equal(a, b) for a, b in zip(buffers[0][1:], buffers[1][1:]))
        # the greedy copy CUDA capture makes of each module (a new GraphModule of a copied graph)
        buffers = [copy.deepcopy(arguments) for _ in range(2)]
        expected, got = greedy_module(reference)(*buffers[0]), greedy_module(direct)(*buffers[1])
        assert all(torch.equal(a, b) for a, b in zip(expected, got))


def _edited(core, name, edit):
    image = read_program_image(core.read_resource(name))
    edit(image.graph)
    return image


@pytest.mark.parametrize("edit, reason", [
    (lambda g: g["graph_module"]["graph"]["nodes"][1].update(target="math.floor"), "target"),
    (lambda g: g["graph_module"]["graph"]["nodes"][1]["inputs"][0].update(arg={"as_graph": {}}), "argument"),
    (lambda g: g["graph_module"]["graph"]["nodes"][1]["inputs"][0].pop("kind"), "kind"),
    (lambda g: g["graph_module"]["signature"]["input_specs"][0].update(
        {"parameter": g["graph_module"]["signature"]["input_specs"][0].pop("user_input")}), "input spec"),
])
def test_what_the_builder_does_not_know_is_left_to_torch(core, edit, reason):
    image = _edited(core, "program.decode.r1t1.rank0", edit)
    with pytest.raises(NotDirect, match=reason):
        build_module(image.graph, image.state_dict, image.constants)


def test_a_program_left_to_torch_still_loads_off_the_cpu(core):
    """An image the builder does not know (here a buffer mutation) loads through torch's path, for
    the meta device too."""
    prepared = core.prepared
    image = read_program_image(core.read_resource("program.tuning.r1t1.rank0"))
    specs = image.graph["graph_module"]["signature"]["output_specs"]
    specs[0] = {"buffer_mutation": specs[0].pop("user_input_mutation")}
    with pytest.raises(NotDirect, match="output spec"):
        build_module(image.graph, image.state_dict, image.constants)
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    (handle,) = producer_handles(prepared, dict.fromkeys(g.name for g in prepared.contract.model.graphs), 0)
    loaded = load_program(core, prepared, handle, declared, torch.device("meta"))
    assert loaded.graph == handle.graph and loaded.input_shapes


def test_a_program_writing_its_input_is_built_as_torch_unlifts_it(core):
    """The tuning producer writes its input in place (a user-input mutation output): the built module
    has torch's nodes (the new value copied into the input before the output) and specs, and writes
    the same values into the same input."""
    image = read_program_image(core.read_resource("program.tuning.r1t1.rank0"))
    assert "user_input_mutation" in image.graph["graph_module"]["signature"]["output_specs"][0]
    reference = deserialize_program(image).module()
    direct = build_module(image.graph, image.state_dict, image.constants)
    assert _nodes(direct.module) == _nodes(reference)
    assert [n.target for n in direct.module.graph.nodes if n.op == "call_function"][-1] is torch.ops.aten.copy_.default
    assert direct.module._in_spec == reference._in_spec and direct.module._out_spec == reference._out_spec
    (shape,) = direct.input_shapes
    inputs = [torch.full(shape, -7, dtype=torch.int32) for _ in range(2)]
    for module in (reference, direct.module):
        module.validate_inputs = False
    assert reference([], inputs[0]) == direct.module([], inputs[1])
    assert torch.equal(inputs[0], inputs[1]) and not torch.equal(inputs[0], torch.full(shape, -7, dtype=torch.int32))


def test_the_schema_tables_equal_torchs_serializer():
    """The builder's own dtype, layout and memory format tables (its import of torch's serializer would
    pull in torch._dynamo) hold every entry torch's serializer reads, with the same objects."""
    from torch._export.serde import serialize

    from helios.runtime.loading.graph_image import _serde_tables

    theirs = (serialize._SERIALIZE_TO_TORCH_DTYPE, serialize._SERIALIZE_TO_TORCH_LAYOUT,
              serialize._SERIALIZE_TO_TORCH_MEMORY_FORMAT)
    for ours, table in zip(_serde_tables(), theirs, strict=True):
        assert ours == {int(number): value for number, value in table.items()}

"""Load-time CPU preparation of programs (`helios.runtime.loading.cpu_programs`): the same values, bit for
bit, with ABI ops called directly and flat inputs."""

from __future__ import annotations

import io

import pytest
import torch

import helios.abi.attention  # noqa: F401 (registers the ops)
from helios.runtime.loading.cpu_programs import CpuProgram, ProgramArgumentError, bind_abi_kernels, cpu_program

HEAD_DIM = 4


class _Step(torch.nn.Module):
    """A runtime-shaped program: a weight list, then tensors; writes a cache, attends, projects."""

    def forward(self, weights, k_cache, v_cache, x, slot_mapping, page_table, query_start, positions):
        q = torch.nn.functional.linear(x, weights[0]).reshape(x.shape[0], 2, HEAD_DIM)
        k = torch.nn.functional.linear(x, weights[1]).reshape(x.shape[0], 1, HEAD_DIM)
        torch.ops.helios.cache_write(k_cache[0], v_cache[0], k, k * 2, slot_mapping)
        out = torch.ops.helios.paged_attention(q, k_cache[0], v_cache[0], page_table, query_start, positions,
                                               0.5, window=0)
        return out.reshape(x.shape[0], -1) @ weights[2], positions + 1


def _exported_module():
    weights = [torch.randn(2 * HEAD_DIM, 6), torch.randn(HEAD_DIM, 6), torch.randn(2 * HEAD_DIM, 3)]
    step = (torch.zeros(1, 4, 4, 1, HEAD_DIM), torch.zeros(1, 4, 4, 1, HEAD_DIM), torch.randn(3, 6),
            torch.tensor([5, 6, 7]), torch.tensor([[3, 1]], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32),
            torch.tensor([1, 2, 3]))
    exported = torch.export.export(_Step(), (weights, *step), strict=False)
    exported.example_inputs = None
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    return torch.export.load(io.BytesIO(buffer.getvalue())).module(), weights, step


def _fresh(step):
    return (torch.zeros_like(step[0]), torch.zeros_like(step[1]), *step[2:])


def _helios_targets(graph) -> list:
    return [n.target for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target.namespace == "helios"]


def test_a_cpu_program_computes_the_same_values_bit_for_bit_and_writes_in_place():
    module, weights, step = _exported_module()
    expected_inputs = _fresh(step)
    expected = module(weights, *expected_inputs)
    program = cpu_program(module)
    assert isinstance(program, CpuProgram) and program.num_weights == 3
    assert _helios_targets(program.graph) == []  # both ABI calls are direct
    got_inputs = _fresh(step)
    pointer = got_inputs[0].data_ptr()
    got = program(weights, *got_inputs)
    assert isinstance(got, tuple) and len(got) == 2
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert got_inputs[0].data_ptr() == pointer and torch.equal(got_inputs[0], expected_inputs[0])
    assert torch.equal(got_inputs[1], expected_inputs[1]) and got_inputs[1].abs().sum() > 0


def test_defaults_are_filled_in_and_keywords_made_positional():
    module, _, _ = _exported_module()
    nodes = [n for n in module.graph.nodes if n.op == "call_function" and "paged_attention" in str(n.target)]
    assert bind_abi_kernels(module.graph) == 2
    (attend,) = nodes
    assert attend.kwargs == {} and len(attend.args) == 8 and attend.args[-1] == 0


def test_a_wrong_weight_list_is_refused():
    module, weights, step = _exported_module()
    program = cpu_program(module)
    with pytest.raises(ProgramArgumentError, match="3 weights"):
        program(weights[:2], *_fresh(step))


def test_a_program_without_a_leading_weight_list_is_left_as_it_is():
    class Plain(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    module = torch.export.export(Plain(), (torch.ones(2), torch.ones(2)), strict=False).module()
    assert cpu_program(module) is module


class _Norm(torch.nn.Module):
    """A program calling an op registered through torch.library.Library (helios::add_rms_norm)."""

    def forward(self, weights, x, delta):
        summed, normed = torch.ops.helios.add_rms_norm(x, delta, weights[0], 1e-6)
        return summed, normed @ weights[1]


def test_library_registered_ops_are_called_through_their_recorded_cpu_bodies():
    import helios.abi.fused  # noqa: F401 (registers the fused ops and their CPU bodies)

    weights = [torch.rand(8) + 0.5, torch.randn(8, 3)]
    x, delta = torch.randn(4, 8), torch.randn(4, 8)
    module = torch.export.export(_Norm(), (weights, x, delta), strict=False).module()
    expected = module(weights, x, delta)
    program = cpu_program(module)
    assert _helios_targets(program.graph) == []
    assert all(torch.equal(a, b) for a, b in zip(program(weights, x, delta), expected))

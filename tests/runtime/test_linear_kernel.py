"""The C++ projection kernel over packed weights (`helios.runtime.loading.linear_kernel`): within
float rounding of torch's linear at row counts on every tile path, partial output blocks and odd
widths, with and without a bias, on views of a fused projection; each row's outputs the same bits
whatever the call's row count, the row's place and the thread count, also as built for 256-bit
vectors (AVX2's tiles); other dtypes, layouts and weights run torch's linear; one packed copy per
weight, within the budget; the binding into a program's fast graph and into a load."""

from __future__ import annotations

import logging

import pytest
import torch

from helios.runtime.loading import linear_kernel
from helios.runtime.loading.cpu_kernels import use_cpu_kernels
from helios.runtime.loading.cpu_programs import cpu_program
from helios.runtime.loading.linear_kernel import (
    PackedWeights, bind_linears, build_kernel, linear_body, pack,
)
from runtime.test_cpu_fast import _inputs, _program, _steps, _weights
from runtime.test_decode_attention_kernel import _OTHER_WIDTH as ATTENTION_AT_256_BITS
from support.other_width import run_at_256_bits


@pytest.fixture(scope="module")
def kernel():
    return build_kernel()


def _random(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _body(kernel, weight):
    return linear_body(kernel, weight, pack(weight))


def _exact(x, weight, bias=None):
    return torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 16, 64, 70])
@pytest.mark.parametrize("out_features, in_features", [(64, 32), (40, 7), (100, 77), (33, 1)])
def test_the_kernel_equals_torch_within_rounding(kernel, rows, out_features, in_features):
    weight, bias = _random(out_features, in_features), _random(out_features, seed=1)
    x = _random(rows, in_features, seed=2)
    body = _body(kernel, weight)
    for b in (None, bias):
        got = body(x, weight, b)
        assert got.shape == (rows, out_features) and got.is_contiguous()
        tolerance = 1e-6 * in_features + 1e-6
        torch.testing.assert_close(got, _exact(x, weight, b), rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b), rtol=tolerance, atol=tolerance)


def test_views_of_a_fused_projection_and_more_dimensions(kernel):
    weight = _random(48, 24)
    body = _body(kernel, weight)
    fused = _random(9, 3 * 24, seed=1)
    view = fused[:, 24:48]  # rows 72 floats apart
    torch.testing.assert_close(body(view, weight), _exact(view, weight), rtol=1e-5, atol=1e-5)
    batched = _random(2, 5, 24, seed=2)
    got = body(batched, weight)
    assert got.shape == (2, 5, 48)
    torch.testing.assert_close(got, _exact(batched, weight), rtol=1e-5, atol=1e-5)
    one = fused[3:4, :24].expand(4, 24)  # rows 0 floats apart: read, never written
    torch.testing.assert_close(body(one, weight), _exact(one, weight), rtol=1e-5, atol=1e-5)
    assert body(_random(0, 24), weight).shape == (0, 48)


def test_a_rows_outputs_are_the_same_bits_alone_in_any_batch_and_on_any_thread_count(kernel, monkeypatch):
    weight, bias = _random(200, 96), _random(200, seed=1)
    body = _body(kernel, weight)
    x = _random(70, 96, seed=2)
    whole = body(x, weight, bias)
    for start, stop in ((0, 1), (5, 6), (69, 70), (3, 20), (60, 70), (1, 66)):
        assert torch.equal(body(x[start:stop].clone(), weight, bias), whole[start:stop])
    monkeypatch.setattr(linear_kernel, "PARALLEL_MACS", 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(body(x, weight, bias), whole)
    finally:
        torch.set_num_threads(threads)


def test_other_dtypes_layouts_and_weights_run_torchs_linear(kernel, monkeypatch):
    weight = _random(32, 16)
    body = _body(kernel, weight)
    cases = [
        (_random(4, 16).to(torch.bfloat16), weight.to(torch.bfloat16), None),  # another weight: another dtype
        (_random(4, 16), weight.clone(), None),  # another tensor of the same values
        (_random(4, 32)[:, ::2], weight, None),  # features not at unit stride
        (_random(3, 4, 16).transpose(0, 1), weight, None),  # rows not at one stride
        (_random(4, 16), weight, _random(64)[::2]),  # a strided bias
        (_random(4, 16).double(), weight, None),
        (_random(16), weight, None),  # one dimension
    ]
    seen = []
    real = torch._C._nn.linear
    monkeypatch.setattr(torch._C._nn, "linear", lambda *args: seen.append(1) or real(*args))
    body = _body(kernel, weight)  # reads torch's linear when made
    for x, w, b in cases:
        x_for_w = x.to(w.dtype) if x.dtype != w.dtype and w.dtype != torch.float32 else x
        try:
            expected = real(x_for_w, w, b)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                body(x_for_w, w, b)
            continue
        assert torch.equal(body(x_for_w, w, b), expected)
    assert len(seen) == len(cases)


def test_pack_lays_out_column_blocks_padded_with_zeros():
    weight = _random(40, 3)
    packed = pack(weight)
    assert packed.shape == (2, 3, 32) and packed.is_contiguous()
    assert torch.equal(packed[0], weight[:32].T) and torch.equal(packed[1, :, :8], weight[32:].T)
    assert not packed[1, :, 8:].any()
    assert torch.equal(pack(_random(64, 5)), _random(64, 5).view(2, 32, 5).transpose(1, 2))
    assert torch.equal(pack(_random(5, 7).T)[0, :, :7], _random(5, 7))  # a transposed weight
    assert torch.equal(pack(_random(7, 3))[0, :, :7], _random(7, 3).T)


def test_a_slow_packing_is_shown_as_progress(monkeypatch):
    from helios.runtime.loading import cpu_kernels

    weights, lines = _weights(), []
    monkeypatch.setattr(cpu_kernels, "SLOW_PACK_SECONDS", 0.0)
    use_cpu_kernels([_Loaded(cpu_program(_program()))], True, lines.append, weights_of=lambda p: weights)
    packed = [line for line in lines if line.startswith("packed ")]
    assert len(packed) == 1 and packed[0].startswith("packed 5 projection weights (")  # qkv x 2, gate/up, down, head
    assert packed[0].endswith(" s") and "for the CPU kernels" in packed[0]


def test_a_core_without_float32_weights_is_told_the_kernels_pass_its_calls_by():
    lines = []
    use_cpu_kernels([_Loaded(cpu_program(_program()))], True, lines.append, weights_of=lambda p: _weights())
    assert not [line for line in lines if "compute in float32" in line]  # float32: the kernels take them
    bf16 = [w.to(torch.bfloat16) for w in _weights()]
    use_cpu_kernels([_Loaded(cpu_program(_program()))], True, lines.append, weights_of=lambda p: bf16)
    notes = [line for line in lines if "compute in float32" in line]
    assert len(notes) == 1 and "this core's bfloat16 weights keep torch's linear" in notes[0]
    assert "--dtype float32" in notes[0]


def test_each_weight_is_packed_once_and_within_the_budget(caplog):
    weight, other = _random(64, 16), _random(32, 16)
    packs = PackedWeights(budget=64 * 16 * 4)
    first = packs.get(weight)
    assert packs.get(weight) is first and packs.get(weight[:, :]) is first and packs.bytes == 64 * 16 * 4
    with caplog.at_level(logging.INFO, logger=linear_kernel.__name__):
        assert packs.get(other) is None and packs.get(other) is None
    assert sum("packed projection weights" in r.getMessage() for r in caplog.records) == 1
    assert PackedWeights.for_this_machine().budget > 0


def test_the_budget_is_a_share_of_memavailable_and_unbounded_where_unknown(monkeypatch):
    monkeypatch.setattr(linear_kernel, "available_nbytes", lambda device: 8000000 * 1024)
    assert PackedWeights.for_this_machine().budget == int(8000000 * 1024 * linear_kernel.MEMORY_SHARE)
    monkeypatch.setattr(linear_kernel, "available_nbytes", lambda device: None)
    assert PackedWeights.for_this_machine().budget >= 1 << 62


def _linear_graph(weight_dtype=torch.float32):
    class Projections(torch.nn.Module):
        def forward(self, weights, x):
            hidden = torch.nn.functional.linear(x, weights[0])
            return torch.nn.functional.linear(hidden.to(weights[1].dtype), weights[1]).float() + \
                torch.nn.functional.linear(x, x)  # the last: a weight that is an input

    weights = [_random(8, 8), _random(8, 8, seed=1).to(weight_dtype)]
    module = torch.export.export(Projections(), (weights, _random(8, 8, seed=2)), strict=False).module()
    return module, weights


def test_binding_takes_projections_over_the_programs_float32_weights(kernel):
    module, weights = _linear_graph(torch.bfloat16)
    graph = module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    packs = PackedWeights(budget=1 << 30)
    assert bind_linears(graph, kernel, weights, packs) == 1
    bound = [n for n in graph.nodes if getattr(n.target, "__name__", "") == "packed_linear"]
    assert len(bound) == 1 and bound[0].args[1] is placeholders[0]
    assert packs.bytes == 32 * 8 * 4  # one block of 32 outputs


class _Loaded:
    def __init__(self, module):
        self.module = module


def test_a_program_with_packed_projections_gives_the_bodies_tokens_and_logits_within_rounding():
    weights = _weights()
    steps = [_inputs(step) for step in range(4)]
    expected = _steps(cpu_program(_program()), weights, _inputs(0), steps)
    program = cpu_program(_program())
    use_cpu_kernels([_Loaded(program)], True, weights_of=lambda p: weights)
    names = [getattr(n.target, "__name__", "") for n in program.fast.graph.nodes if n.op == "call_function"]
    assert names.count("packed_linear") == 2 * 3 + 1  # per layer qkv, gate/up, down; the head
    got = _steps(program, weights, _inputs(0), steps)
    for got_step, expected_step in zip(got, expected):
        assert torch.equal(got_step[0], expected_step[0]) and torch.equal(got_step[4], expected_step[4])
        torch.testing.assert_close(got_step[1], expected_step[1], rtol=1e-5, atol=1e-5)


def test_the_load_binds_the_projections_of_every_program():
    from helios.runtime.loading.model import LoadOptions, load_model
    from runtime.test_model_fixture import open_fixture

    model = load_model(open_fixture(), LoadOptions())
    decode = [p for p in model.programs if p.graph.startswith("decode")]
    assert decode
    for program in decode:
        names = [getattr(n.target, "__name__", "") for n in program.module.fast.graph.nodes]
        assert "packed_linear" in names and "linear" not in names


_OTHER_WIDTH = r"""  # after `run_at_256_bits`' prelude (torch imported)
from helios.runtime.loading.linear_kernel import build_kernel, linear_body, pack
kernel = build_kernel()
generator = torch.Generator().manual_seed(0)
for rows, out_features, in_features in [(16, 100, 77), (70, 40, 33), (1, 8, 3), (13, 64, 256)]:
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    body = linear_body(kernel, weight, pack(weight))
    got = body(x, weight, bias)
    exact = torch.nn.functional.linear(x.double(), weight.double(), bias.double()).float()
    torch.testing.assert_close(got, exact, rtol=1e-6 * in_features + 1e-6, atol=1e-6 * in_features + 1e-6)
    for row in (0, rows // 2, rows - 1):
        assert torch.equal(body(x[row:row + 1].clone(), weight, bias), got[row:row + 1])
print("ok")
"""


def test_the_kernels_built_for_256_bit_vectors_equal_their_references_and_keep_each_rows_bits():
    # This kernel (tiles of 6 rows x 2 vectors), then the decode attention kernel's check (blocks of 8 keys,
    # tests/runtime/test_decode_attention_kernel.py) in the same process: one start and import for both.
    run_at_256_bits(_OTHER_WIDTH + ATTENTION_AT_256_BITS)

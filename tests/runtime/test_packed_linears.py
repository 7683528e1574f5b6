"""Projections through oneDNN's packed weights in compiled CPU programs
(`helios.runtime.loading.packed_linears`): the same products within float rounding, the choice per
shape. A compiled program whose projections are all packed gives the eager program's tokens: the
compiled program of tests/runtime/test_program_compile.py (one Inductor compile serves both files)."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.loading import packed_linears
from helios.runtime.loading.packed_linears import pack_linears, packed_linear

pytestmark = pytest.mark.skipif(not packed_linears.available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("rows, features, out, bias", [(1, 32, 40, False), (16, 128, 768, False), (64, 256, 96, True)])
def test_a_packed_projection_equals_linear_within_rounding(rows, features, out, bias):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, features, generator=generator)
    weight = torch.randn(out, features, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    got = packed_linear(x, packed, b)
    assert got.shape == (rows, out) and got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_the_choice_is_measured_once_per_shape(monkeypatch):
    measured = []
    monkeypatch.setattr(packed_linears, "_choices", {})
    times = {16: (100e-6, 50e-6), 1: (100e-6, 90e-6), 2: (20e-6, 10e-6)}  # (plain, packed) seconds a call
    monkeypatch.setattr(packed_linears, "_measure", lambda rows, w, b: measured.append(rows) or times[rows])
    weight = torch.zeros(8, 4)
    assert packed_linears.packing_pays(16, weight, None) and packed_linears.packing_pays(16, torch.ones(8, 4), None)
    assert not packed_linears.packing_pays(1, weight, None)  # not fast enough
    assert not packed_linears.packing_pays(2, weight, None)  # twice as fast, but saves less than a split costs
    assert measured == [16, 1, 2]


def test_the_measurement_times_both_calls():
    plain, packed = packed_linears._measure(4, torch.randn(16, 8), None)
    assert 0 < plain < 0.01 and 0 < packed < 0.01


def _linear_graph():
    graph = torch.fx.Graph()
    x, weight, wide, other = (graph.placeholder(name) for name in ("x", "weight", "wide", "other"))
    projected = graph.call_function(torch._C._nn.linear, (x, weight))
    unpacked = graph.call_function(torch._C._nn.linear, (wide, other))  # float64: never packed
    graph.output((projected, unpacked))
    return graph


def test_only_float32_input_weights_over_static_2d_inputs_are_packed():
    graph = _linear_graph()
    real = {"x": torch.randn(5, 8), "weight": torch.randn(6, 8), "wide": torch.randn(5, 8, dtype=torch.float64),
            "other": torch.randn(6, 8, dtype=torch.float64)}
    values = {node: real[node.name] for node in graph.nodes if node.op == "placeholder"}
    module = torch.nn.Module()
    shared: dict = {}
    assert pack_linears(module, graph, real, values, shared, pays=lambda rows, w, b: rows == 5) == 1
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert targets == [packed_linear, torch._C._nn.linear]
    assert len(shared) == 1 and module.packed_weight_0 is next(iter(shared.values()))
    gm = torch.fx.GraphModule(module, graph)
    got, wide = gm(real["x"], real["weight"], real["wide"], real["other"])
    assert torch.equal(wide, torch.nn.functional.linear(real["wide"], real["other"]))
    torch.testing.assert_close(got, torch.nn.functional.linear(real["x"], real["weight"]), rtol=1e-5, atol=1e-5)
    assert pack_linears(torch.nn.Module(), _linear_graph(), real, values, shared, pays=lambda *a: False) == 0

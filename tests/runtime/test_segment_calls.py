"""Compiled segments called without AOT Autograd's runtime wrappers (`segment_calls`): a pure
segment calls the generated code directly and gives the wrapped call's outputs (an output viewing
an input views the same input); anything the check cannot prove equal keeps the wrapped call."""

from __future__ import annotations

import operator
from types import SimpleNamespace

import torch

from helios.runtime.loading.segment_calls import _direct_call, compile_segment


def _graph(body) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    graph.output(body(graph, x, y))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _fused(graph, x, y):
    product = graph.call_function(torch.ops.aten.mul.Tensor, (x, y))
    total = graph.call_function(torch.ops.aten.sum.dim_IntList, (product, [-1], True))
    return (graph.call_function(torch.ops.aten.add.Tensor, (total, x)),
            graph.call_function(torch.ops.aten.exp.default, (y,)))


def _aliasing(graph, x, y):
    view = graph.call_function(torch.ops.aten.t.default, (x,))
    return (view, graph.call_function(torch.ops.aten.add.Tensor, (x, y)))


def test_a_pure_segment_calls_the_generated_code_with_the_wrapped_outputs():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    module = _graph(_fused)
    eager = module(x, y)
    segment, direct = compile_segment(module, [torch.zeros(4, 8), torch.zeros(4, 8)], "compiled_segment_0")
    assert direct and segment.__name__ == "compiled_segment_0"
    with torch.inference_mode():
        outputs = segment(x, y)
    assert len(outputs) == 2
    for got, want in zip(outputs, eager):
        torch.testing.assert_close(got, want)
    assert operator.getitem(outputs, 1).stride() == eager[1].stride()
    assert "def call" in segment.source_code and "assert_size_stride(" not in segment.source_code


def test_the_size_checks_are_left_out_of_segments_only():
    """Inductor's own setting is as it was after a segment compiles (other compiles keep their checks)."""
    from torch._inductor import config

    before = config.size_asserts
    compile_segment(_graph(_fused), [torch.zeros(4, 8), torch.zeros(4, 8)], "compiled_segment_2")
    assert config.size_asserts == before


def test_an_output_viewing_an_input_views_it_in_the_direct_call_too():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    segment, direct = compile_segment(_graph(_aliasing), [torch.zeros(4, 8), torch.zeros(4, 8)], "compiled_segment_1")
    with torch.inference_mode():
        view, total = segment(x, y)
    assert direct and view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert torch.equal(view, x.t()) and torch.equal(total, x + y)


def _inner(outputs, **fields):
    """A stand-in for `compile_fx_inner`'s output whose generated call returns `outputs`."""
    return SimpleNamespace(**{"current_callable": lambda arguments: outputs, "mutated_inputs": (),
                              "inputs_to_check": [], **fields})


def test_what_cannot_be_proven_the_same_call_keeps_the_wrapped_one():
    x = torch.ones(2, 3)
    same = (x + 1,)
    wrapped = lambda *arguments: (x + 1,)  # noqa: E731
    assert _direct_call([_inner(same)], wrapped, [x]) is not None
    assert _direct_call([_inner(same), _inner(same)], wrapped, [x]) is None  # a second graph (a backward)
    assert _direct_call([_inner(same, mutated_inputs=(0,))], wrapped, [x]) is None
    assert _direct_call([SimpleNamespace(current_callable=lambda a: same)], wrapped, [x]) is None  # other internals
    assert _direct_call([_inner((x + 1, x))], wrapped, [x]) is None  # another output count
    assert _direct_call([_inner((x + 2,))], wrapped, [x]) is None  # other values
    assert _direct_call([_inner(((x + 1).t().contiguous().t(),))], wrapped, [x]) is None  # other strides
    assert _direct_call([_inner((x,))], lambda *a: (x.clone(),), [x]) is None  # aliasing where the wrapped copies

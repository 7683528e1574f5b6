"""CPU programs compiled at load (`helios.runtime.loading.compile_segments`, `program_compile`): the
segmented graph computes the fast graph's values bit for bit before anything is compiled; the
compiled program gives the eager program's tokens, and its logits and cache writes within float
rounding; compilation failures are `ProgramCompileError`s."""

from __future__ import annotations

import argparse
import operator
from types import SimpleNamespace

import pytest
import torch

from helios.abi import cpu_bodies
from helios.cli.runtime_flags import add_runtime_flags, runtime_flags
from helios.contract import StartupOptions
from helios.errors import LoadError
from helios.runtime.loading import cache_write_kernel, decode_attention_kernel, packed_linears, program_compile
from helios.runtime.loading.compile_segments import (
    compiled_runs, is_compiled, is_free, rotate, segment_graph,
)
from helios.runtime.loading.cpu_programs import cpu_program
from helios.runtime.loading.packed_linears import packed_linear
from helios.runtime.loading.program_compile import ProgramCompileError, compile_program, compile_programs
from runtime.test_cpu_fast import _inputs, _program, _steps, _weights

STEPS = [_inputs(step) for step in range(4)]


def _placeholders(graph, tensors) -> dict:
    names = [node.name for node in graph.nodes if node.op == "placeholder"]
    return dict(zip(names, tensors))


def _eager_segmented(program, weights, inputs):
    """The fast graph segmented for these tensors, run eagerly (nothing compiled)."""
    graph = segment_graph(program.fast.graph, _placeholders(program.fast.graph, (*weights, *inputs)))
    return torch.fx.GraphModule(program.fast, graph), graph


def test_the_segmented_graph_computes_the_fast_graphs_values_bit_for_bit():
    weights, inputs = _weights(), _inputs(0)
    expected = _steps(cpu_program(_program()), _weights(), _inputs(0), STEPS)
    program = cpu_program(_program())
    module, graph = _eager_segmented(program, weights, inputs)
    got = _steps(lambda w, *i: module.forward(*w, *i), weights, inputs, STEPS[:1])
    got += _steps(lambda w, *i: module.forward(*w, *i), weights, inputs, STEPS[1:])
    for got_step, expected_step in zip(got, expected):
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got_step, expected_step))
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert cpu_bodies.rotary_cache_write_planned not in targets and targets.count(rotate) == 4  # q and k, 2 layers
    assert targets.count(cpu_bodies.cache_write_planned) == 2
    assert torch.Tensor.size not in targets  # input sizes are constants


def test_opaque_calls_separate_few_compiled_runs_and_keep_their_order():
    program = cpu_program(_program())
    original = [n.target for n in program.fast.graph.nodes if n.op == "call_function" and not is_compiled(n)
                and not is_free(n) and n.target is not cpu_bodies.rotary_cache_write_planned]
    _, graph = _eager_segmented(program, _weights(), _inputs(0))
    opaque = [n for n in graph.nodes if n.op == "call_function" and not is_compiled(n) and not is_free(n)]
    kept = [n.target for n in opaque if n.target is not cpu_bodies.cache_write_planned]
    assert kept == [t for t in original if t is not cpu_bodies.plan_rotary]
    assert cpu_bodies.completion_record not in kept  # its columns are computed in the sampling tail's run
    assert any(n.target is cpu_bodies.completion_record for run in compiled_runs(graph) for n in run)
    runs = compiled_runs(graph)
    # Per layer: the rotations and what follows the attention; plus the head, the sampling tail.
    assert len(runs) <= 2 * 2 + 3
    assert sum(len(run) for run in runs) > 3 * len(opaque)


def test_a_compiled_call_never_moves_before_an_opaque_write_of_what_it_reads():
    graph = torch.fx.Graph()
    x, index, value, y = (graph.placeholder(name) for name in ("x", "index", "value", "y"))
    before = graph.call_function(torch.mul, (x, 2))
    write = graph.call_function(torch.index_put_, (x, [index], value))
    view = graph.call_function(torch.select, (x, 0, 0))
    after = graph.call_function(torch.add, (view, 1))
    independent = graph.call_function(torch.add, (y, 1))
    graph.output((before, after, independent, write))
    module = torch.fx.GraphModule(torch.nn.Module(), segment_graph(graph, {}))
    order = [n.name for n in module.graph.nodes if n.op == "call_function"]
    assert order.index("mul") < order.index("index_put_") < order.index("add")
    assert order.index("add_1") < order.index("index_put_")  # reads nothing the write takes
    x_value = torch.zeros(3, 2)
    got = module(x_value, torch.tensor([0]), torch.ones(1, 2), torch.zeros(1))
    assert torch.equal(got[0], torch.zeros(3, 2)) and torch.equal(got[1], torch.full((2,), 2.0))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A `CpuProgram` of the test decoder, its fast graph compiled with Inductor (cache in a temp dir),
    every projection through oneDNN's packed weights where this torch build has them (one compile
    serves both: where packing pays is measured per shape, tests/runtime/test_packed_linears.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        program = cpu_program(_program())
        weights, inputs = _weights(), _inputs(0)
        with pytest.MonkeyPatch.context() as packing:
            packing.setattr(packed_linears, "packing_pays", lambda rows, weight, bias: True)
            module = compile_program(program, [weights, *inputs])
        yield program, module, weights, inputs


@pytest.mark.slow  # Inductor compiles the decoder's segments with g++: about 13-30 s on a 2-core machine
def test_a_compiled_program_gives_the_eager_tokens_and_logits_within_rounding(compiled, monkeypatch):
    import torch._inductor.compile_fx
    import torch._inductor.cpp_builder

    program, module, weights, inputs = compiled
    if packed_linears.available():  # qkv, gate/up and down of both layers, and the head
        packed = [n for n in module.graph.nodes if n.op == "call_function" and n.target is packed_linear]
        assert len(packed) == 2 * 3 + 1
    expected = _steps(_program(), _weights(), _inputs(0), STEPS)
    used = []
    forward = module.forward
    module.forward = lambda *args: used.append(1) or forward(*args)
    program.use_compiled(module, (*weights, *inputs))

    def compiles(*args, **kwargs):
        raise AssertionError("compiled while serving")

    monkeypatch.setattr(torch._inductor.cpp_builder.CppBuilder, "build", compiles)  # nothing is built from now on
    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", compiles)

    def reference(*args, **kwargs):
        raise AssertionError("a full decode step's attention or cache write left the kernels")

    # Every compiled call takes the kernels for every layer (the first call runs the checked graph).
    monkeypatch.setattr(decode_attention_kernel, "attend", reference)
    monkeypatch.setattr(cache_write_kernel.cpu_bodies, "cache_write_planned", reference)
    got = _steps(program, weights, inputs, STEPS)
    assert len(used) == len(STEPS) - 1  # the first call checked, the others compiled
    for got_step, expected_step in zip(got, expected):
        record, logits, k_cache, v_cache, counts = got_step
        assert torch.equal(record, expected_step[0])  # tokens, lengths: exact
        torch.testing.assert_close(logits, expected_step[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_cache, expected_step[2], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v_cache, expected_step[3], rtol=1e-5, atol=1e-6)
        assert torch.equal(counts, expected_step[4])
    segments = [n for n in module.graph.nodes if n.op == "call_function"
                and getattr(n.target, "__name__", "").startswith("compiled_segment_")]
    assert segments and not [n for n in module.graph.nodes if n.op == "call_function" and n.target is torch.add]
    assert not [n for n in module.graph.nodes if n.op == "call_function" and n.target is torch.select]  # bound views
    # A segment's contiguous output reaches the next segment as it is (no `contiguous` call between).
    direct = [a for n in segments for a in n.args if isinstance(a, torch.fx.Node) and a.target is operator.getitem
              and getattr(a.args[0].target, "__name__", "").startswith("compiled_segment_")]
    assert direct
    assert not [n for n in module.graph.nodes if is_free(n) and not n.users]  # no view left unread
    # The decode step's attention runs the kernel built at load (its logits compared above).
    attention = [n.target.__name__ for n in module.graph.nodes if n.op == "call_function"
                 and getattr(n.target, "__name__", "") in ("decode_attention_kernel", "attention_planned")]
    assert attention == ["decode_attention_kernel"] * 2
    writes = [n for n in module.graph.nodes if n.op == "call_function" and n.target is cpu_bodies.cache_write_planned]
    assert not writes and [n for n in module.graph.nodes if getattr(n.target, "__name__", "") == "cache_write_kernel"]
    assert [n for n in module.graph.nodes if getattr(n.target, "__name__", "") == "greedy_sample_kernel"]


def test_unread_views_are_dropped_and_nothing_else():
    graph = torch.fx.Graph()
    x, index, value = (graph.placeholder(name) for name in ("x", "index", "value"))
    graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 1, 2))  # read by nothing: dropped
    kept = graph.call_function(torch.select, (x, 0, 0))
    graph.call_function(torch.index_put_, (x, [index], value))  # read by nothing, but a write: kept
    graph.output((kept,))
    assert program_compile._drop_unused_views(graph) == 1
    assert [n.target for n in graph.nodes if n.op == "call_function"] == [torch.select, torch.index_put_]


def test_only_what_a_compiled_segment_returns_contiguous_skips_the_copy():
    assert program_compile._contiguous(torch.zeros(2, 3)) and not program_compile._contiguous(torch.zeros(3, 2).t())
    assert not program_compile._contiguous(None)


@pytest.mark.slow
def test_tensors_of_other_memory_or_layouts_run_the_fast_graph(compiled):
    program, module, weights, inputs = compiled
    program.use_compiled(module, (*weights, *inputs))
    strided = list(weights)
    strided[3] = weights[3].t().contiguous().t()  # the same values and shape, other strides
    program(strided, *inputs)
    program(strided, *inputs)
    assert program._runner is program.fast
    program(weights, *_inputs(0))  # other memory
    assert program._runner is program.fast
    views = [tensor[:] for tensor in inputs]  # the same memory and layout, as the runtime passes its buffers
    program(weights, *views)
    assert program._runner is module


def _loaded(program):
    return SimpleNamespace(module=program, graph="decode", batch_capacity=3, packed_token_capacity=3)


def test_without_a_compiler_loading_fails_with_a_typed_error(monkeypatch):
    monkeypatch.setattr(program_compile, "compiler_available", lambda: None)
    with pytest.raises(ProgramCompileError, match="C\\+\\+ compiler") as caught:
        compile_programs([_loaded(cpu_program(_program()))], lambda p: [_weights(), *_inputs(0)])
    assert isinstance(caught.value, LoadError)


def test_an_inductor_failure_is_a_typed_error_naming_the_program(monkeypatch):
    import torch._inductor.compile_fx

    def fails(*args, **kwargs):
        raise RuntimeError("no kernel for you")

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", fails)  # the entry point segments compile through
    lines = []
    with pytest.raises(ProgramCompileError, match="decode .*no kernel for you"):
        compile_programs([_loaded(cpu_program(_program()))], lambda p: [_weights(), *_inputs(0)], lines.append)
    assert lines == ["compiling program 1/1: decode (batch 3, 3 tokens)"]


def test_programs_without_a_fast_graph_are_left_alone():
    assert compile_programs([SimpleNamespace(module=torch.nn.Identity())], lambda p: []) == 0


@pytest.mark.parametrize("flags, compiled_programs", [([], False), (["--compile-programs"], True)])
def test_the_compile_programs_flag_reaches_the_load_options(flags, compiled_programs):
    parser = argparse.ArgumentParser()
    add_runtime_flags(parser)
    load, _, _ = runtime_flags(parser.parse_args(flags), StartupOptions(), "cpu")
    assert load.compile_programs is compiled_programs and load.progress is not None  # compilation or kernel builds


def test_loading_with_compile_programs_compiles_every_program_before_returning(monkeypatch):
    from helios.runtime.loading import program_compile
    from helios.runtime.loading.model import LoadOptions, load_model
    from runtime.test_model_fixture import open_fixture

    seen = []

    def recording(programs, arguments, progress):
        seen.extend((p.graph, p.batch_capacity, len(arguments(p))) for p in programs)
        progress("compiled")

    monkeypatch.setattr(program_compile, "compile_programs", recording)  # imported by the load where used
    lines = []
    model = load_model(open_fixture(), LoadOptions(compile_programs=True, progress=lines.append))
    assert sorted(seen) == sorted((p.graph, p.batch_capacity, 1 + len(p.inputs)) for p in model.programs)
    assert lines == ["compiled"]
    seen.clear()
    load_model(open_fixture(), LoadOptions())
    assert seen == []

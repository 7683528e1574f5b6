"""The capture-time bookkeeping rewrite (`helios.runtime.loading.step_calls`).

A tiny random Llama core's exported programs (as a CUDA model builds them), full and greedy graphs
rewritten, serve plain, penalised and biased greedy requests with exactly the CPU path's tokens (two
execution frames); the rewrite binds the cache-slot mapping to one call, merges the repeated slot
clamps and last-token indices, makes the fill tensors constants and binds both integer
accumulations. Small graphs pin what it must leave alone: a call whose input is written between two
equal calls, a factory whose result is written, a graph calling an unknown Python function.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import helios.runtime.loading.programs as program_loading
from helios.abi.accumulate import accumulate_into
from helios.abi.slots import packed_slots
from helios.runtime.loading.cuda_graphs import CapturedProgram, greedy_module, held_tensors
from helios.runtime.loading.step_calls import collapse_step_calls, step_module
from runtime.test_greedy_rows_graph import MAX_TOKENS, _exported_runtime, _runtime, _serve, core_path, reference_tokens  # noqa: F401 (a fixture)

CPU = torch.device("cpu")


class _Replayed(CapturedProgram):
    """A captured program's stand-in: the rewritten eager module and greedy variant, run on the
    recorded arguments whatever the call passes."""

    def __init__(self, module, arguments):
        self.module = step_module(module, CPU, enabled=True)
        self.greedy = step_module(greedy_module(module), CPU, enabled=True)
        self.arguments, self.replays = arguments, {True: 0, False: 0}

    def replay(self, greedy: bool, fresh: bool = False):
        self.replays[greedy] += 1
        return (self.greedy if greedy else self.module)(*self.arguments)


def _rewritten_runtime(core_path, monkeypatch):  # noqa: F811
    return _exported_runtime(core_path, monkeypatch, _Replayed)


def test_rewritten_graphs_give_the_cpu_path_tokens(core_path, monkeypatch):  # noqa: F811
    frames = 2
    expected = reference_tokens(core_path)
    runtime, programs = _rewritten_runtime(core_path, monkeypatch)
    try:
        assert _serve(runtime, frames) == expected
        assert sum(p.module.replays[True] for p in programs.values()) > MAX_TOKENS
    finally:
        runtime.close()


def test_the_decode_graph_loses_its_repeats_and_fills(core_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(program_loading, "cpu_program", lambda module: module)
    runtime = _runtime(core_path)
    try:
        decode = next(p for p in runtime.model.programs if p.graph == "decode")
        greedy = greedy_module(decode.module)
        rewritten = torch.fx.GraphModule(greedy, greedy.graph)
        before = _calls(rewritten)
        counts = collapse_step_calls(rewritten, CPU)
    finally:
        runtime.close()
    # (a bfloat16 core's greedy graph samples the head's product: the bias's zeros_like went with its copy)
    assert counts.slots == 1 and counts.merged >= 6 and counts.constants >= 5 and counts.accumulations == 2
    assert counts.dropped >= 10  # the slot mapping's calls and the sampling's unread cast
    assert len([n for n in rewritten.graph.nodes if n.target is packed_slots]) == 1
    assert not [n for n in rewritten.graph.nodes if n.target is torch.ops.aten.searchsorted.Tensor]
    clamps = [n for n in rewritten.graph.nodes if n.target is torch.ops.aten.clamp.default
              and n.args[0].op == "placeholder" and n.args[0].target == "request_slots"]
    assert len(clamps) == 1
    assert not [n for n in rewritten.graph.nodes if n.target in (torch.ops.aten.zeros_like.default,
                                                                 torch.ops.aten.full_like.default)]
    assert len([n for n in rewritten.graph.nodes if n.target is accumulate_into]) == 2
    assert len(_calls(rewritten)) == len(before) - counts.merged - counts.constants - counts.dropped
    # the constants are the module's own tensors, which the Triton precompile's dry run never zeroes
    constants = [getattr(rewritten, n.target) for n in rewritten.graph.nodes if n.op == "get_attr"]
    assert len(constants) >= counts.constants
    assert {id(t) for t in constants} <= {id(t) for t in held_tensors(rewritten)}


def test_graphs_built_from_the_image_are_rewritten_alike(core_path, monkeypatch):  # noqa: F811
    """A CUDA model builds its programs straight from the image JSON (`graph_image`: no meta value where
    a shape is symbolic, such as the count tables'): the same bindings as torch's build."""
    direct, torch_build = program_loading._direct, program_loading._with_torch
    monkeypatch.setattr(program_loading, "_with_torch",
                        lambda image, data, *args: direct(image, *args) or torch_build(image, data, *args))
    monkeypatch.setattr(program_loading, "cpu_program", lambda module: module)
    runtime = _runtime(core_path)
    try:
        decode = next(p for p in runtime.model.programs if p.graph == "decode" and not p.token_logprobs)
        greedy = greedy_module(decode.module)
        counts = collapse_step_calls(torch.fx.GraphModule(greedy, greedy.graph), CPU)
    finally:
        runtime.close()
    assert counts.slots == 1 and counts.accumulations == 2 and counts.merged >= 6 and counts.constants >= 4


def _calls(module) -> list:
    return [n for n in module.graph.nodes if n.op == "call_function"]


def _traced(function, *inputs):
    """`function` traced to aten calls; in-place calls' results replaced by the tensor they wrote, as
    an exported program reads a written input (or a written plane) after the call that writes it."""
    module = make_fx(function, tracing_mode="fake")(*inputs)
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target._schema.name.endswith("_"):
            node.replace_all_uses_with(node.args[0])
    module.recompile()
    return module


def test_a_write_between_two_equal_calls_keeps_both():
    def step(slots, table):
        first = table[slots.clamp(min=0)]
        table.add_(1)
        return first, table[slots.clamp(min=0)]

    module = _traced(step, torch.tensor([1, -1]), torch.arange(4))
    counts = collapse_step_calls(module, CPU)
    assert counts.merged == 1  # the clamp, not the gathers on either side of the write
    first, second = module(torch.tensor([1, -1]), torch.arange(4))
    assert first.tolist() == [1, 0] and second.tolist() == [2, 1]


def test_a_written_fill_stays_a_call_of_each_step():
    def step(x):
        ones = torch.ones_like(x)
        ones.add_(x)
        return ones * 2, torch.zeros_like(x) + x

    module = _traced(step, torch.arange(3))
    counts = collapse_step_calls(module, CPU)
    assert counts.constants == 1  # zeros_like only
    for _ in range(2):  # a constant would add up across calls
        doubled, same = module(torch.arange(3))
        assert doubled.tolist() == [2, 4, 6] and same.tolist() == [0, 1, 2]


def test_a_graph_calling_an_unknown_function_keeps_its_repeats():
    def step(x):
        return x.clamp(min=0) + x.clamp(min=0), torch.zeros_like(x)

    module = _traced(step, torch.arange(-2, 2))
    node = next(n for n in module.graph.nodes if n.op == "output")
    with module.graph.inserting_before(node):
        module.graph.call_function(_unknown, (next(iter(module.graph.nodes)),))
    module.recompile()
    counts = collapse_step_calls(module, CPU)
    assert counts.merged == 0 and counts.constants == 0
    assert step_module(module, CPU, enabled=False) is module


def _unknown(x):
    return x

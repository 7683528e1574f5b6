"""`helios.runtime.loading.elementwise_runs`: runs of consecutive small integer elementwise calls as one
generated Triton kernel, against the calls themselves bit for bit (the kernel under Triton's
interpreter without CUDA, compiled with it; the launcher's fallback on CPU tensors), and what stays
as it is (float arithmetic, broadcasting, a lone call)."""

from __future__ import annotations

import operator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import test_triton_attention  # noqa: F401  (enables the interpreter on machines without CUDA first)
from helios.runtime.loading.elementwise_runs import fuse_runs, runs_module
from test_triton_attention import DEVICE


def _epilogue(sampled, rows, pending, fill, lens):
    """The shape of a decode step's sampling epilogue (`helios.ignition.program`; `fill` stands for
    the constants `helios.runtime.loading.step_calls` makes of its fills)."""
    tokens = torch.where(rows, sampled, fill)
    emitted = tokens >= 0
    counted, clamped = emitted.to(torch.int32), tokens.clamp(min=0)
    pending_gathered = pending[clamped]  # a gather: ends the first run
    change = torch.where(emitted, tokens - pending_gathered, fill + 1)
    offered = lens.to(torch.int64)
    return tokens, counted, clamped, change, offered > 0, emitted.to(torch.int64) + offered


def _inputs():
    generator = torch.Generator().manual_seed(3)
    sampled = torch.randint(-5, 40, (9,), generator=generator)
    rows = torch.rand(9, generator=generator) > 0.3
    return sampled, rows, torch.randint(0, 50, (50,), generator=generator), torch.full((9,), -1), \
        torch.randint(0, 3, (9,), generator=generator, dtype=torch.int32)


def _launchers(module) -> list:
    return [n.target for n in module.graph.nodes if n.op == "call_function" and type(n.target).__name__ == "_Launcher"]


def test_runs_compute_the_calls_bit_for_bit():
    inputs = _inputs()
    module = make_fx(_epilogue, tracing_mode="fake")(*inputs)
    expected = module(*inputs)
    fused = runs_module(module, enabled=True)
    launchers = _launchers(fused)
    assert len(launchers) >= 2
    for launcher in launchers:  # the kernels themselves (the interpreter on the CPU)
        launcher.__call__ = launcher.launch
    on_device = [t.to(DEVICE) for t in inputs]
    kernels = [_run_kernels(fused, on_device)]
    fallback = fused(*inputs) if DEVICE == "cpu" else None  # CPU tensors: the launchers' fallback graphs
    for got in kernels + ([fallback] if fallback is not None else []):
        assert all(torch.equal(a.cpu(), b) and a.dtype == b.dtype for a, b in zip(got, expected))


def _run_kernels(module, inputs):
    """`module` with every launcher forced to its kernel."""
    graph = module.graph
    for node in graph.nodes:
        if node.op == "call_function" and type(node.target).__name__ == "_Launcher":
            node.target = node.target.launch
    module.recompile()
    return module(*inputs)


def test_float_arithmetic_broadcasting_and_lone_calls_stay():
    def step(x, y, z):
        scaled = (x * 2.0) + y  # float arithmetic
        wide = z.clamp(min=0) + torch.ones(3, 1, dtype=torch.int64)  # broadcast into [3, 4]
        return scaled, wide, (z > 1)  # a lone compare after them

    inputs = (torch.randn(4), torch.randn(4), torch.arange(4))
    module = make_fx(step, tracing_mode="fake")(*inputs)
    assert fuse_runs(module.graph) == 0
    assert runs_module(module, enabled=True) is module
    assert runs_module(module) is module  # FUSE_RUNS is off


def test_getitem_outputs_keep_their_order():
    inputs = _inputs()
    module = runs_module(make_fx(_epilogue, tracing_mode="fake")(*inputs), enabled=True)
    picks = [n for n in module.graph.nodes if n.target is operator.getitem]
    assert picks and all(isinstance(n.args[1], int) for n in picks)

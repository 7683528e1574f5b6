"""Capture-time choice of the matrix-vector kernel for a program's one-row projections (CUDA).

A program's ``aten.linear`` calls run cuBLAS. Where `helios.abi.triton_gemv.gemv_tile` names a
Triton tile for a call's static shapes (rows, out and in features, weight dtype: a committed table
measured on the device, see that module), `bind_gemv` points the call at
`helios.abi.triton_gemv.gemv_linear`, which computes the same product (float32 sums) and falls back
to ``F.linear`` for any other input. The kernel's module (and triton) is imported only when a call
has a tile: the table is read without it. Shapes come from the nodes' static meta tensors (what a loaded
program's graph records); a call whose shapes are not all static keeps cuBLAS. The choice is made
once, when `helios.runtime.loading.cuda_graphs` captures the program; nothing is decided while
serving.
"""

from __future__ import annotations

import copy
import math

import torch

from helios.abi.gemv_tiles import gemv_tile

__all__ = ["bind_gemv", "gemv_module"]

_LINEAR = torch.ops.aten.linear.default


def bind_gemv(graph: torch.fx.Graph) -> int:
    """Points every ``aten.linear`` call whose static shapes have a tile at `gemv_linear`; returns
    how many. The caller recompiles the graph's module."""
    tiled = [node for node in graph.nodes if _tiled(node)]
    if tiled:
        from helios.abi.triton_gemv import gemv_linear  # imports triton: only where a call has a tile

        for node in tiled:
            node.target = gemv_linear
    return len(tiled)


def gemv_module(module):
    """A module computing `module`'s program with its tiled one-row projections on the Triton GEMV
    (a new graph sharing `module`'s attributes), or `module` itself when no call has a tile or it
    has no graph."""
    if not isinstance(module, torch.fx.GraphModule) or not any(_tiled(node) for node in module.graph.nodes):
        return module  # no copy of a graph that keeps cuBLAS throughout (most programs)
    graph = copy.deepcopy(module.graph)
    bind_gemv(graph)
    return torch.fx.GraphModule(module, graph)


def _tiled(node: torch.fx.Node) -> bool:
    """Whether `node` is an ``aten.linear`` call whose static shapes have a tile."""
    if node.op != "call_function" or node.target is not _LINEAR:
        return False
    x, weight = (_static(arg) for arg in node.args[:2])
    if x is None or weight is None or weight.dim() != 2 or x.dim() == 0 or x.dtype != weight.dtype:
        return False
    rows = math.prod(x.shape[:-1])
    return gemv_tile(rows, weight.shape[0], weight.shape[1], weight.dtype) is not None


def _static(arg) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
        return None
    return value

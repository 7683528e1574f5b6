"""Capture-time choice of the Triton kernels for a program's projections (CUDA).

A program's ``aten.linear`` calls run cuBLAS. Where `helios.abi.gemv_tiles` names a Triton tile for
a call's static shapes (rows, out and in features, weight dtype: committed tables measured on the
device), `bind_gemv` points the call at `helios.abi.triton_gemv.gemv_linear` (one row: `gemv_tile`)
or `helios.abi.triton_skinny.skinny_linear` (more rows: `skinny_tile`), which compute the same
product (float32 sums) and fall back to ``F.linear`` for any other input; a call without a tile whose
shapes are eligible is pointed at `helios.abi.cublaslt.lt_linear` (cuBLASLt's algorithm measured
fastest at load, `helios.runtime.loading.gemm_algos`). A skinny call whose only
reader is ``helios::silu_mul`` (the MLP's gate/up projection) becomes one
`helios.abi.triton_skinny.skinny_silu_linear` call (the SiLU-mul in the product's epilogue) where
its tile allows it (`silu_fits`). A kernel's module (and triton) is imported only when a call has a
tile: the tables are read without it. Shapes come from the nodes' static meta tensors (what a loaded
program's graph records); a call whose shapes are not all static keeps cuBLAS. The choice is made
once, when `helios.runtime.loading.cuda_graphs` captures the program; nothing is decided while
serving.
"""

from __future__ import annotations

import copy
import math

import torch

from helios.abi.gemv_tiles import gemv_tile, skinny_tile
from helios.runtime.loading.gemm_algos import lt_eligible

__all__ = ["bind_gemv", "gemv_module"]

_LINEAR = torch.ops.aten.linear.default


def bind_gemv(graph: torch.fx.Graph, fuse_silu: bool = True) -> int:
    """Points every ``aten.linear`` call whose static shapes have a tile at `gemv_linear` or
    `skinny_linear` (and, with `fuse_silu`, a skinny gate/up call and its SiLU-mul at
    `skinny_silu_linear`); returns how many projections. The caller recompiles the graph's module."""
    tiled = [(node, kind) for node in graph.nodes if (kind := _tiled(node))]
    for node, kind in tiled:  # the kernels' modules import triton: only where a call has a tile
        if kind == "gemv":
            from helios.abi.triton_gemv import gemv_linear as target
        elif kind == "lt":
            from helios.abi.cublaslt import lt_linear as target
        else:
            from helios.abi.triton_skinny import skinny_linear as target
        node.target = target
        if kind == "skinny" and fuse_silu:
            _fuse_silu_mul(graph, node)
    return len(tiled)


def _fuse_silu_mul(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Replaces ``silu_mul(node)`` by one `skinny_silu_linear` call where the skinny projection
    `node` (no bias) is read by that call alone and its tile fits the fused kernel."""
    from helios.abi import fused  # noqa: F401  (registers helios::silu_mul)
    from helios.abi.triton_skinny import silu_fits, skinny_silu_linear

    users = list(node.users)
    if len(node.args) != 2 or node.kwargs or len(users) != 1:
        return
    silu = users[0]
    silu_mul = torch.ops.helios.silu_mul.default
    if silu.op != "call_function" or silu.target is not silu_mul or silu.kwargs or silu.args != (node,):
        return
    x, weight = (_static(arg) for arg in node.args)
    rows = math.prod(x.shape[:-1])
    tile = skinny_tile(rows, weight.shape[0], weight.shape[1], weight.dtype)
    if x.dim() != 2 or tile is None or not silu_fits(rows, weight.shape[0], weight.shape[1], tile):
        return
    silu.target = skinny_silu_linear
    silu.args = node.args
    graph.erase_node(node)


def gemv_module(module, in_place: bool = False):
    """A module computing `module`'s program with its tiled projections on the Triton kernels (a new
    graph sharing `module`'s attributes), or `module` itself when no call has a tile or it has no
    graph. `in_place`: the caller owns `module` (a copy nothing else uses), which is rewritten,
    recompiled and returned itself, without copying its graph."""
    if not isinstance(module, torch.fx.GraphModule) or not any(_tiled(node) for node in module.graph.nodes):
        return module  # no copy of a graph that keeps cuBLAS throughout (most programs)
    if in_place:
        bind_gemv(module.graph)
        module.recompile()
        return module
    graph = copy.deepcopy(module.graph)
    bind_gemv(graph)
    return torch.fx.GraphModule(module, graph)


def _tiled(node: torch.fx.Node) -> str | None:
    """"gemv" or "skinny" where `node` is an ``aten.linear`` call whose static shapes have a tile
    in that kernel's table, "lt" where it has none and cuBLASLt's algorithm can be chosen for it
    (`helios.runtime.loading.gemm_algos.lt_eligible`), else None."""
    if node.op != "call_function" or node.target is not _LINEAR:
        return None
    x, weight = (_static(arg) for arg in node.args[:2])
    if x is None or weight is None or weight.dim() != 2 or x.dim() == 0 or x.dtype != weight.dtype:
        return None
    rows = math.prod(x.shape[:-1])
    shapes = (rows, weight.shape[0], weight.shape[1], weight.dtype)
    if gemv_tile(*shapes) is not None:
        return "gemv"
    if skinny_tile(*shapes) is not None:
        return "skinny"
    return "lt" if lt_eligible(node) else None


def _static(arg) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
        return None
    return value

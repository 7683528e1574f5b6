"""Capture-time fusion of each layer's rotary cache write with its attention (CUDA).

A prepared program calls ``helios::rotary_cache_write`` (rotated q out, keys and values into the
planes) and then the attention op over the same planes with that q. `fuse_rotary_attention` turns
each such pair, where the rotated q feeds nothing but that attention, into one call of
``helios::rotary_paged_attention`` (`helios.abi.rotary_attention`), which computes exactly the
pair's result and writes the same planes: on a decode-shaped step one kernel launch per layer
instead of two. The rewrite reads only the graph's structure (which node feeds which), is made once
when `helios.runtime.loading.cuda_graphs` captures a program, and leaves the prepared program and
the CPU path as they are. It is applied only where `FUSE_AT_CAPTURE` (or the caller) enables it.
"""

from __future__ import annotations

import copy

import torch

import helios.abi.attention  # noqa: F401  (registers the ops named below)
import helios.abi.attention_chunked  # noqa: F401
import helios.abi.attention_sinks  # noqa: F401
import helios.abi.fused  # noqa: F401
import helios.abi.rotary_attention  # noqa: F401

__all__ = ["ATTENTION_OPTIONALS", "fusable_attention", "fuse_rotary_attention", "prefetch_output_weights",
           "rotary_module", "split_rotary_attention"]

_OPS = torch.ops.helios
# attention overload -> (index of sinks in its arguments or None, index of splits or None)
_ATTENTION = {
    _OPS.paged_attention.default: (None, None),
    _OPS.paged_attention_tuned.default: (None, 8),
    _OPS.paged_attention_sinks.default: (8, None),
    _OPS.paged_attention_sinks_tuned.default: (8, 9),
}
_BY_OPTIONALS = {value: key for key, value in _ATTENTION.items()}
_CHUNKED = _OPS.paged_attention_chunked.default
ATTENTION_OPTIONALS = _ATTENTION  # (read only) for other capture-time rewrites of the same pairs
# Whether `helios.runtime.loading.cuda_graphs` fuses the pairs when it captures a program. On: on the H200
# the fused launch matched the two launches bit for bit at 8B shapes (bench/rotary_attention_ab.py, six
# cases) and saves one launch per layer. In bench/results/h200_session24_call1 the small-shape tests and the
# 8B CUDA-graph test (fused against the two kernels at 1, 7, 64 and 256 rows, then against the CPU attention
# over the device's rotation) passed on the device, and the anchor comparison measured decode with the
# fusion at 1.013x, 1.016x and 1.003x of the unfused capture at batch 1, 64 and 256 (1.20x, 1.15x, 1.08x
# of the anchor). False restores the two launches (`--rotary-fusion off` in bench/anchor_compare.py).
FUSE_AT_CAPTURE = True
# Whether programs with chunked attention (``helios::paged_attention_chunked``: Llama 4) fuse their other
# pairs. Off from session 58 to 62: Llama 4's float32 core gave other greedy tokens than the CPU in CUDA
# graphs with its pairs fused (bench/results/h100_session58, call 3), an error that needed the step-calls
# rewrite too (bench/results/h100_session61). Both it and session 61's unfused cold first-token difference
# were the Triton precompile's dry run zeroing the step-calls constants it gave a skipped launch (Llama 4's
# ``ones`` MoE combine weights, the rotary tables of its position-free layers), fixed in session 62
# (`KernelCompiler.protect`). In bench/results/session62 each case on its own empty Triton cache, fused,
# unfused, without workers and eager, gives the CPU's 64 tokens. Off: unfused, as sessions 58-61 captured them.
FUSE_WITH_CHUNKED = True
# Fused calls of at most this many tokens (static) get their output projection's weight as the L2
# prefetch hint at capture; 0: none (the hint is measured by bench/rotary_attention_ab.py and the step
# A/B of bench/decode_step_profile.py before it is adopted).
PREFETCH_MAX_TOKENS = 0
_VIEWS = (torch.ops.aten.select.int, torch.ops.aten.slice.Tensor, torch.ops.aten.view.default)


def fuse_rotary_attention(graph: torch.fx.Graph) -> int:
    """Rewrites every (rotary cache write, attention over its planes with its rotated q alone) pair
    into one ``helios::rotary_paged_attention`` call at the attention's place; returns how many.
    The caller recompiles the graph's module."""
    count = 0
    for node in list(graph.nodes):
        attention = fusable_attention(node)
        if attention is None:
            continue
        sinks_at, splits_at = _ATTENTION[attention.target]
        args = attention.args
        attention.target = _OPS.rotary_paged_attention.default
        attention.args = (*node.args, *args[3:8], None if sinks_at is None else args[sinks_at],
                          None if splits_at is None else args[splits_at])
        graph.erase_node(node)
        count += 1
    return count


def fusable_attention(node: torch.fx.Node) -> torch.fx.Node | None:
    """The attention call `node` (a rotary cache write) can fuse with, or None."""
    if node.op != "call_function" or node.target is not _OPS.rotary_cache_write.default or node.kwargs:
        return None
    if len(node.users) != 1:
        return None
    attention = next(iter(node.users))
    if attention.op != "call_function" or attention.target not in _ATTENTION or attention.kwargs:
        return None
    k_cache, v_cache = node.args[5], node.args[6]
    args = attention.args
    return attention if args[0] is node and _same(args[1], k_cache) and _same(args[2], v_cache) else None


def _same(a, b) -> bool:
    """Whether two graph values are one plane: one node, or two calls of one view op on the same
    arguments (a trace that selected a layer's plane twice)."""
    if a is b:
        return True
    return (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and a.op == b.op == "call_function"
            and a.target is b.target and a.target in _VIEWS and a.args == b.args and a.kwargs == b.kwargs)


def split_rotary_attention(graph: torch.fx.Graph) -> int:
    """The inverse rewrite (each ``helios::rotary_paged_attention`` call back into the pair it
    replaced); returns how many. For same-process comparisons of the two forms."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _OPS.rotary_paged_attention.default:
            continue
        rotary_args, geometry, (sinks, splits) = node.args[:8], node.args[8:13], node.args[13:15]  # no prefetch
        with graph.inserting_before(node):
            rotated = graph.call_function(_OPS.rotary_cache_write.default, tuple(rotary_args))
        rotated.meta = dict(node.meta)
        optionals = (None if sinks is None else 8, None if splits is None else (9 if sinks is not None else 8))
        node.target = _BY_OPTIONALS[optionals]
        node.args = (rotated, rotary_args[5], rotary_args[6], *geometry,
                     *(arg for arg in (sinks, splits) if arg is not None))
        count += 1
    return count


def prefetch_output_weights(graph: torch.fx.Graph, enable: bool = True, max_tokens: int | None = None) -> int:
    """Sets (or, `enable` False, clears) the prefetch argument of every fused call whose output only
    feeds, through one reshape, a projection (``aten.linear`` or the one-row GEMV binding): the
    projection's weight, which the decode launch then asks the L2 cache to fetch while the
    attention runs; with `max_tokens`, only calls of at most that many tokens (static shapes).
    Returns how many calls changed."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not _OPS.rotary_paged_attention.default:
            continue
        weight = _projection_weight(node) if enable and _tokens_at_most(node, max_tokens) else None
        args = (*node.args[:15], weight)
        if args != tuple(node.args) + (None,) * (16 - len(node.args)):
            node.args = args
            count += 1
    return count


def _tokens_at_most(node: torch.fx.Node, max_tokens: int | None) -> bool:
    if max_tokens is None:
        return True
    value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    size = value.shape[0] if isinstance(value, torch.Tensor) else None
    return isinstance(size, int) and size <= max_tokens


def _projection_weight(node: torch.fx.Node):
    """The weight of the projection that alone consumes `node`'s output through one reshape, or None."""
    users = list(node.users)
    if len(users) != 1 or users[0].target not in (torch.ops.aten.reshape.default, torch.ops.aten.view.default):
        return None
    projections = list(users[0].users)
    if len(projections) != 1 or projections[0].op != "call_function":
        return None
    target = projections[0].target
    if target is not torch.ops.aten.linear.default and getattr(target, "__name__", "") != "gemv_linear":
        return None
    return projections[0].args[1]


def rotary_module(module, enabled: bool | None = None):
    """A module computing `module`'s program with its rotary/attention pairs fused (a new graph sharing
    `module`'s attributes), or `module` itself when it has no graph or no pair, when fusion is not
    `enabled` (default: `FUSE_AT_CAPTURE`), or when it calls chunked attention (`FUSE_WITH_CHUNKED`)."""
    enabled = FUSE_AT_CAPTURE if enabled is None else enabled
    if not enabled or not isinstance(module, torch.fx.GraphModule) \
            or not any(fusable_attention(n) for n in module.graph.nodes):
        return module
    if not FUSE_WITH_CHUNKED and any(n.op == "call_function" and n.target is _CHUNKED for n in module.graph.nodes):
        return module
    graph = copy.deepcopy(module.graph)
    fuse_rotary_attention(graph)
    if PREFETCH_MAX_TOKENS:
        prefetch_output_weights(graph, max_tokens=PREFETCH_MAX_TOKENS)
    return torch.fx.GraphModule(module, graph)

"""Repeated calls in a CPU program's fast graph: a pure call made again on the same arguments is
made once (`merge_repeated_calls`), the later uses reading the first result.

An exported program repeats small computations its modules each make for themselves: a decode
step's graph clamps the request slots for the page table, the token feed, the sampler and the
state update, slices the row bounds three times and compares the sampled tokens with 0 three
times. On the CPU each such call costs microseconds of dispatch inside a step. A later call is
merged into an earlier one when

- both call the same function of `PURE` (an out-of-place aten binding, or a view) with equal
  arguments (the same nodes; constants of the same type and representation);
- nothing in the graph may write the tensors the two read: no node that may mutate (anything
  outside `PURE` and `READS_ONLY`: an in-place call such as ``index_put_`` writes its first
  argument, any other call all of its tensor arguments) receives one of their inputs, any node
  they are computed from, or a view of these;
- nothing may write their results (no user that may mutate).

Then the later call would compute the same values from the same unchanged inputs, so reading the
first result is exact (a view shares memory as the repeated view would). It runs after
`helios.runtime.loading.fast_calls.bind_fast_calls`, on the bindings' targets.
"""

from __future__ import annotations

import operator

import torch

from helios.abi import cpu_bodies
from helios.abi.paged_reference import plan_attention

_aten = torch.ops.aten

# Views: their result aliases their first argument.
VIEWS = frozenset({
    torch.select, _aten.slice.Tensor, torch.reshape, torch.unsqueeze, torch.squeeze, torch.Tensor.view,
    torch.Tensor.to, torch.transpose, torch.permute, torch.Tensor.expand, torch.split_with_sizes, operator.getitem,
})
# Out-of-place calls (a fresh result) and views: the calls that may be merged.
PURE = VIEWS | frozenset({
    torch.clamp, torch.ge, torch.gt, torch.le, torch.lt, torch.eq, torch.ne, torch.sub, torch.add, torch.mul,
    torch.div, torch.remainder, torch.neg, torch.where, torch.bitwise_and, torch.cumsum, torch.cat,
    _aten.index.Tensor, torch.zeros_like, torch.ones_like, torch.full_like, torch.cos, torch.sin,
})
# Calls that read their tensor arguments and write none of them (never merged).
READS_ONLY = frozenset({
    torch._C._nn.linear, torch.embedding, torch.scatter_add, torch.searchsorted, torch.arange, torch.zeros,
    torch.Tensor.size, torch.index_select, torch.roll, torch.rsqrt, torch.pow, torch.mean,
    cpu_bodies.rms_norm, cpu_bodies.add_rms_norm, cpu_bodies.silu_mul, cpu_bodies.gelu_tanh_mul,
    cpu_bodies.completion_record, cpu_bodies.sample_rows, cpu_bodies.sample_rows_gathering, cpu_bodies.attention_planned,
    cpu_bodies.plan_slots, cpu_bodies.plan_rotary, plan_attention,
})


def merge_repeated_calls(graph: torch.fx.Graph) -> int:
    """Merges every later pure call into the earlier identical one (see the module docstring);
    returns how many calls were removed."""
    written = _written_roots(graph)
    seen: dict[tuple, torch.fx.Node] = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in PURE or "out" in node.kwargs or not _unwritten(node, written):
            continue
        key = _key(node)
        if key is None:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            merged += 1
    return merged


def _root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory `node` views (itself unless it is a view)."""
    while node.op == "call_function" and node.target in VIEWS and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _written_roots(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The roots of every tensor some node may write."""
    return {_root(leaf) for node in graph.nodes for leaf in _written_arguments(node)}


def _written_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes whose tensors `node` may write: none for `PURE` and `READS_ONLY` calls, the first
    argument of an in-place call (``index_put_``), every argument of any other call; the graph's
    outputs go to the caller, who may write them."""
    if node.op == "output":
        return _nodes(node.args)
    if node.op not in ("call_function", "call_method", "call_module"):
        return []
    if node.op == "call_function" and (node.target in PURE or node.target in READS_ONLY) and "out" not in node.kwargs:
        return []
    name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
    if name.endswith("_") and not name.endswith("__"):
        return _nodes(node.args[:1])
    return _nodes((node.args, node.kwargs))


def _nodes(value) -> list[torch.fx.Node]:
    if isinstance(value, torch.fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _nodes(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _nodes(item)]
    return []


def _unwritten(node: torch.fx.Node, written: set[torch.fx.Node]) -> bool:
    """Whether nothing may write `node`'s result or the tensors it reads (its direct inputs: a
    pure call's values depend on nothing else)."""
    if _root(node) in written or any(node in _written_arguments(user) for user in node.users):
        return False
    return not any(_root(argument) in written for argument in node.all_input_nodes)


def _key(node: torch.fx.Node) -> tuple | None:
    """What identifies the call: its target and arguments (None when an argument has no key)."""
    try:
        return (node.target, _constant(node.args), _constant(tuple(sorted(node.kwargs.items()))))
    except TypeError:
        return None


def _constant(value):
    if isinstance(value, torch.fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_constant(item) for item in value))
    if value is None or isinstance(value, (bool, int, float, str, slice, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return (type(value).__name__, repr(value))  # repr tells -0.0 from 0.0 and keeps NaN equal
    raise TypeError(f"no key for {type(value).__name__}")

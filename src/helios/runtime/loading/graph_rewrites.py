"""Exact load-time rewrites of a program's graph into fewer ops (for the CPU, where each op costs
a few microseconds of dispatch whatever its size).

`fuse_rotary_halves`: rotary embeddings as `transformers` writes them multiply
``rotate_half(x) = cat([-x[..., h:], x[..., :h]], -1)`` by ``sin``: two slices, a negation and a
concatenation per use, for queries and keys of every layer. The same product is
``roll(x, h, -1) * cat([-sin[..., :h], sin[..., h:]], -1)``: elementwise it is ``x2 * (-s1)``
instead of ``(-x2) * s1`` (IEEE negation is exact and a product's magnitude does not depend on
signs, so the values are bit for bit the same), the rolled tensor is one op, and the signed
``sin`` is built once per ``sin`` and shared by every layer.
"""

from __future__ import annotations

import torch

_aten = torch.ops.aten
_SLICE, _NEG, _CAT, _MUL, _ROLL = _aten.slice.Tensor, _aten.neg.default, _aten.cat.default, _aten.mul.Tensor, _aten.roll.default
_END = 2 ** 63 - 1  # how export records an open slice end


def fuse_rotary_halves(graph: torch.fx.Graph) -> int:
    """Rewrites every ``rotate_half(x) * sin`` (see the module docstring) whose uses are all such
    products with a ``sin`` of the same last extent; returns how many rotations were rewritten."""
    signed: dict[torch.fx.Node, torch.fx.Node] = {}
    rewritten = 0
    for node in list(graph.nodes):
        matched = _rotate_half(node)
        if matched is None:
            continue
        source, half = matched
        factors = [_other_factor(user, node) for user in node.users]
        if not factors or any(f is None or _last_extent(f) != 2 * half for f in factors):
            continue
        with graph.inserting_before(node):
            rolled = graph.call_function(_ROLL, (source, [half], [-1]))
        for user, factor in zip(list(node.users), factors):
            if factor not in signed:
                with graph.inserting_before(user):
                    signed[factor] = _signed_halves(graph, factor, half)
            user.args = (rolled, signed[factor])
        _erase_unused(graph, node)
        rewritten += 1
    return rewritten


def _rotate_half(node: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """(x, h) when `node` is ``cat([neg(x[..., h:]), x[..., :h]], -1)`` over x's last dim of 2h."""
    if node.op != "call_function" or node.target is not _CAT or len(node.args) != 2 or node.kwargs:
        return None
    parts, dim = node.args
    if not isinstance(parts, (list, tuple)) or len(parts) != 2:
        return None
    negated, front = parts
    if not _is_call(negated, _NEG) or not _is_call(front, _SLICE):
        return None
    back = negated.args[0]
    if not _is_call(back, _SLICE) or back.args[0] is not front.args[0]:
        return None
    source = front.args[0]
    extent = _last_extent(source)
    if extent is None or extent % 2 or not _is_last(dim, source):
        return None
    half = extent // 2
    if _slice_of(back, source) != (half, extent) or _slice_of(front, source) != (0, half):
        return None
    return source, half


def _is_call(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def _slice_of(node: torch.fx.Node, source: torch.fx.Node) -> tuple[int, int] | None:
    """(start, end) of a step-1 slice of `source`'s last dim, the end clipped to its extent."""
    args = list(node.args) + [None] * (5 - len(node.args))
    _, dim, start, end, step = args[:5]
    if node.kwargs or step not in (None, 1) or not _is_last(dim, source):
        return None
    extent = _last_extent(source)
    start = 0 if start is None else start
    end = extent if end is None or end == _END else end
    if not isinstance(start, int) or not isinstance(end, int) or start < 0 or end < 0:
        return None
    return start, min(end, extent)


def _is_last(dim, source: torch.fx.Node) -> bool:
    value = source.meta.get("val")
    return isinstance(dim, int) and isinstance(value, torch.Tensor) and dim in (-1, value.dim() - 1)


def _last_extent(node) -> int | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or not isinstance(value.shape[-1], int):
        return None
    return int(value.shape[-1])


def _other_factor(user: torch.fx.Node, node: torch.fx.Node) -> torch.fx.Node | None:
    """The other operand of ``mul(node, other)`` / ``mul(other, node)``; None for any other use."""
    if not _is_call(user, _MUL) or user.kwargs or len(user.args) != 2:
        return None
    first, second = user.args
    other = second if first is node else first if second is node else None
    if other is node or not isinstance(other, torch.fx.Node):
        return None
    return other


def _signed_halves(graph: torch.fx.Graph, factor: torch.fx.Node, half: int) -> torch.fx.Node:
    """``cat([-factor[..., :h], factor[..., h:]], -1)`` inserted at the graph's insertion point."""
    front = graph.call_function(_SLICE, (factor, -1, 0, half))
    back = graph.call_function(_SLICE, (factor, -1, half, _END))
    negated = graph.call_function(_NEG, (front,))
    return graph.call_function(_CAT, ([negated, back], -1))


def _erase_unused(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Erases `node` and, recursively, the inputs it leaves without users (pure ops only)."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.users or current.op != "call_function" or current.target not in (_CAT, _NEG, _SLICE):
            continue
        inputs = [arg for arg in current.all_input_nodes]
        graph.erase_node(current)
        pending.extend(inputs)

"""Capture-time binding of a program's traced cache-slot mapping to one launch (CUDA).

`helios.ignition.decoder.slot_mapping`, traced, is eleven aten calls ending in ``where(token_index <
query_start[R], page * P + positions % P, full_like(..., -1))``. `bind_packed_slots` finds that exact
shape in a graph (every call, constant and shared input checked; the clamp bounds and the query-start
entry passed through as the graph computes them) and replaces its ``where`` by one
`helios.abi.slots.packed_slots` call on the same inputs; the calls it leaves unread are then
dropped (`helios.runtime.loading.step_calls`). Anything else is left as it is.
"""

from __future__ import annotations

import torch

from helios.abi.slots import packed_slots

__all__ = ["bind_packed_slots"]

_aten = torch.ops.aten
_END = 2 ** 63 - 1  # how export records an open slice end


def bind_packed_slots(graph: torch.fx.Graph) -> int:
    """Replaces every traced slot mapping of `graph` by a `packed_slots` call; returns how many. The
    caller recompiles (and drops the calls left unread)."""
    matches = [(node, found) for node in graph.nodes if (found := _match(node)) is not None]
    if not matches:
        return 0
    for node, arguments in matches:
        with graph.inserting_before(node):
            bound = graph.call_function(packed_slots, arguments)
        bound.meta = dict(node.meta)
        node.replace_all_uses_with(bound)
        graph.erase_node(node)
    return len(matches)


def _match(node: torch.fx.Node):
    """(query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end) when `node` is
    the ``where`` of a traced slot mapping, else None."""
    where = _call(node, _aten.where.self, 3)
    if where is None:
        return None
    packed, slots, fill = where
    if _call(fill, _aten.full_like.default, 2) != [slots, -1] or fill.kwargs.keys() - {"pin_memory"}:
        return None
    compared = _call(packed, _aten.lt.Tensor, 2)
    summed = _call(slots, _aten.add.Tensor, 2)
    if compared is None or summed is None:
        return None
    token_index, ended = compared
    selected = _call(ended, _aten.select.int, 3)
    scaled, remainder = summed
    widened = _call(scaled, _aten.mul.Tensor, 2)
    rest = _call(remainder, _aten.remainder.Scalar, 2)
    if selected is None or selected[1] != 0 or widened is None or rest is None:
        return None
    query_start, _, packed_end = selected
    looked_up, page_tokens = widened
    positions = rest[0]
    if rest[1] != page_tokens or not isinstance(page_tokens, int) or _call(looked_up, _aten.to.dtype, 2) is None \
            or looked_up.args[1] != torch.int64:
        return None
    indexed = _call(looked_up.args[0], _aten.index.Tensor, 2)
    if indexed is None or not isinstance(indexed[1], (list, tuple)) or len(indexed[1]) != 2:
        return None
    row_tables, (rows, pages) = indexed
    last_row = _row_bound(rows, query_start, token_index)
    last_page = _page_bound(pages, positions, page_tokens)
    if last_row is None or last_page is None or not _is_token_index(token_index, positions):
        return None
    return query_start, row_tables, positions, page_tokens, last_row, last_page, packed_end


def _row_bound(rows, query_start, token_index):
    """The max bound of ``clamp(searchsorted(query_start[1:], token_index, right=True), None, bound)``."""
    clamped = _call(rows, _aten.clamp.default, 3)
    if clamped is None or clamped[1] is not None:
        return None
    searched = _call(clamped[0], _aten.searchsorted.Tensor, 2)
    if searched is None or searched[1] is not token_index or rows.args[0].kwargs != {"right": True}:
        return None
    ends = _call(searched[0], _aten.slice.Tensor, 4)
    if ends is None or ends[:3] != [query_start, 0, 1] or ends[3] not in (_END, None):
        return None
    return clamped[2]


def _page_bound(pages, positions, page_tokens):
    """The max bound of ``clamp(div(positions, page_tokens, rounding_mode="floor"), 0, bound)``."""
    clamped = _call(pages, _aten.clamp.default, 3)
    if clamped is None or clamped[1] != 0:
        return None
    divided = _call(clamped[0], _aten.div.Tensor_mode, 2)
    if divided != [positions, page_tokens] or clamped[0].kwargs != {"rounding_mode": "floor"}:
        return None
    return clamped[2]


def _is_token_index(node, positions) -> bool:
    """Whether `node` is ``arange(T)`` (int32) with T the positions' static length."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target is not _aten.arange.default:
        return False
    value = positions.meta.get("val") if isinstance(positions, torch.fx.Node) else None
    length = value.shape[0] if isinstance(value, torch.Tensor) and value.dim() == 1 else None
    extra = set(node.kwargs) - {"dtype", "device", "pin_memory", "layout"}
    return (len(node.args) == 1 and isinstance(length, int) and node.args[0] == length and not extra
            and node.kwargs.get("dtype") == torch.int32)


def _call(node, target, arity: int):
    """The positional arguments of `node` (padded with None to `arity`) when it calls `target` with at
    most that many, else None. Keyword arguments are the caller's to check."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target is not target:
        return None
    if len(node.args) > arity:
        return None
    return list(node.args) + [None] * (arity - len(node.args))

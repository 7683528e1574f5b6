"""Load-time clean-up of a loaded program's graph: nodes that compute nothing at run time.

`torch.export` records, for every ``Tensor.to(dtype)`` of the traced code, an ``aten.to.dtype``
call and an ``aten._assert_tensor_metadata`` check of its input. Neither changes a value when the
input already has that dtype (a float32 program's norms cast float32 to float32): ``to`` returns
its input itself and the check re-validates what export proved. On the CPU every node is one more
Python-dispatched op per step (a decode step of a small model runs a few hundred), so they are
removed once, at load. A conversion that changes the dtype is kept. The graph stays equivalent:
a removed ``to`` is replaced by its input, which it would have returned (the same tensor).
"""

from __future__ import annotations

import torch

_TO_DTYPE = torch.ops.aten.to.dtype
try:
    _ASSERT = torch.ops.aten._assert_tensor_metadata.default
except (AttributeError, RuntimeError):  # a torch without the op records no such checks
    _ASSERT = None


def drop_no_op_nodes(module: torch.fx.GraphModule) -> int:
    """Removes metadata assertions and same-dtype ``to`` calls from `module`'s graph (in place,
    recompiled); returns how many nodes were removed."""
    graph = module.graph
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if _ASSERT is not None and node.target is _ASSERT and not node.users:
            graph.erase_node(node)
            removed += 1
        elif node.target is _TO_DTYPE and _same_dtype(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            removed += 1
    if removed:
        graph.lint()
        module.recompile()
    return removed


def _same_dtype(node: torch.fx.Node) -> bool:
    """Whether the ``to(dtype)`` call converts nothing (and is a plain call: no copy, no layout)."""
    source = node.args[0] if node.args else None
    wanted = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    extra = dict(node.kwargs)
    extra.pop("dtype", None)
    if not isinstance(source, torch.fx.Node) or len(node.args) > 2 or extra.get("copy", False):
        return False
    value = source.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype == wanted

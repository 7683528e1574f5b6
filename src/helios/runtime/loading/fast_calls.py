"""Exported programs call ``torch.ops.aten.NAME.OVERLOAD``: a boxed call that parses its arguments
against the op's schema in Python-visible C++ (about 1.7-2.5 us on the CPU host of the CPU path).
torch's own Python bindings of the same ops (``torch.add``, ``Tensor.to``, ...) parse them in
generated code and call the same kernels unboxed (0.7-1.6 us). On the CPU, where a small model's
step is a few hundred such calls, `bind_fast_calls` points the graph's calls of the overloads
listed in `FAST_CALLS` at those bindings (at load; nothing is traced or compiled).

Each binding dispatches to exactly the overload it replaces for the arguments an exported graph
passes (tensors, Python scalars, lists, dtype and device keywords): the same kernel on the same
values. `tests/runtime/test_fast_calls.py` checks it for every entry by recording what each call
dispatches to.
"""

from __future__ import annotations

import torch

_aten = torch.ops.aten


def _index(x: torch.Tensor, indices: list) -> torch.Tensor:
    """``aten.index.Tensor`` through torch's indexing binding (2 us against 6.5 us boxed): ``x[i]`` and
    ``x[i, j]`` with tensor indices of at least one dimension dispatch exactly that overload. A None
    (a whole dimension there, where indexing would add one) or a 0-dim index (indexing would
    select a view) takes the boxed call."""
    for index in indices:
        if index is None or index.dim() == 0:
            return _aten.index.Tensor(x, indices)
    return x[indices[0]] if len(indices) == 1 else x[tuple(indices)]


FAST_CALLS: dict[torch._ops.OpOverload, object] = {
    _aten.add.Tensor: torch.add,
    _aten.sub.Tensor: torch.sub,
    _aten.mul.Tensor: torch.mul,
    _aten.div.Tensor: torch.div,
    _aten.div.Tensor_mode: torch.div,
    _aten.remainder.Scalar: torch.remainder,
    _aten.remainder.Tensor: torch.remainder,
    _aten.neg.default: torch.neg,
    _aten.cos.default: torch.cos,
    _aten.sin.default: torch.sin,
    _aten.rsqrt.default: torch.rsqrt,
    _aten.pow.Tensor_Scalar: torch.pow,
    _aten.mean.dim: torch.mean,
    _aten.__and__.Tensor: torch.bitwise_and,
    _aten.bitwise_and.Tensor: torch.bitwise_and,
    _aten.eq.Scalar: torch.eq,
    _aten.eq.Tensor: torch.eq,
    _aten.ne.Scalar: torch.ne,
    _aten.ge.Scalar: torch.ge,
    _aten.ge.Tensor: torch.ge,
    _aten.gt.Scalar: torch.gt,
    _aten.gt.Tensor: torch.gt,
    _aten.le.Scalar: torch.le,
    _aten.lt.Scalar: torch.lt,
    _aten.lt.Tensor: torch.lt,
    _aten.where.self: torch.where,
    _aten.clamp.default: torch.clamp,
    _aten.cat.default: torch.cat,
    _aten.cumsum.default: torch.cumsum,
    _aten.embedding.default: torch.embedding,
    _aten.full_like.default: torch.full_like,
    _aten.zeros_like.default: torch.zeros_like,
    _aten.ones_like.default: torch.ones_like,
    _aten.zeros.default: torch.zeros,
    _aten.arange.default: torch.arange,
    _aten.arange.start: torch.arange,
    _aten.index_put_.default: torch.index_put_,
    _aten.index_select.default: torch.index_select,
    _aten.index.Tensor: _index,
    _aten.linear.default: torch._C._nn.linear,
    _aten.reshape.default: torch.reshape,
    _aten.view.default: torch.Tensor.view,
    _aten.scatter_add.default: torch.scatter_add,
    _aten.searchsorted.Tensor: torch.searchsorted,
    _aten.select.int: torch.select,
    _aten.split_with_sizes.default: torch.split_with_sizes,
    _aten.to.dtype: torch.Tensor.to,
    _aten.unsqueeze.default: torch.unsqueeze,
    _aten.squeeze.dim: torch.squeeze,
    _aten.transpose.int: torch.transpose,
    _aten.permute.default: torch.permute,
    _aten.expand.default: torch.Tensor.expand,
    _aten.roll.default: torch.roll,
    _aten.sym_size.int: torch.Tensor.size,
}


def bind_fast_calls(graph: torch.fx.Graph) -> int:
    """Points every call of an overload in `FAST_CALLS` at its binding; returns how many. The
    caller recompiles the graph's module."""
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            fast = FAST_CALLS.get(node.target)
            if fast is not None:
                node.target = fast
                count += 1
    return count

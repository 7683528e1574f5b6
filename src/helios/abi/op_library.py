"""How an execution-ABI op is defined: `abi_op`, a plain ``torch.library.Library`` registration with
the decorator surface of ``torch.library.custom_op`` (``register_kernel``, ``register_fake``).

Why not ``custom_op``: it runs every kernel behind ``torch._disable_dynamo``, which imports
``torch._dynamo`` on the first call of any op (1.3-3 s of one core here, 4-6.6 s on the GPU
machine's host, where a CUDA load's main thread used to wait 3.5 s for it:
bench/results/h200_session29_call1), and it adds Python layers to every call that does not run in a
captured graph (about 20 us each on the CPU path). The ABI ops are inference-only: nothing traces
them with dynamo while serving, they have no autograd formula and no caller relies on a version
counter. Preparation's ``torch.export`` sees the same thing either way: the op, its schema
(mutated arguments annotated ``(a!)``) and its fake implementation.

An op is registered as ``custom_op`` registers it: its Python body at ``CompositeExplicitAutograd``
(every device without a kernel of its own), each ``register_kernel(device)`` kernel at that device's
key (CUDA: the CPU runs the body), the fake at ``Meta`` and for fake tensors. The body is also
recorded as the op's CPU body (`helios.abi.registry.register_cpu_body`), which a CPU program calls
without the dispatcher. A schema's mutated arguments must be exactly `mutates_args`.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

import torch

from helios.abi.registry import NAMESPACE, register_cpu_body

__all__ = ["AbiOp", "abi_op"]

_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
_DISPATCH_KEYS = {"cuda": "CUDA"}  # device kernels; the body serves the CPU


class AbiOp:
    """One ``helios::NAME`` op: calling it calls the registered op (the dispatcher picks the kernel);
    `body` is its Python body, `kernels` its device kernels by device type."""

    def __init__(self, qualname: str, schema: str, mutates_args: Iterable[str], body: Callable):
        namespace, _, name = qualname.partition("::")
        if namespace != NAMESPACE or not name:
            raise ValueError(f"an ABI op is named {NAMESPACE}::NAME, got {qualname!r}")
        _check_mutated(qualname, torch._C.parse_schema(qualname + schema), tuple(mutates_args))
        self.name, self.qualname, self.body = name, qualname, body
        self.kernels: dict[str, Callable] = {}
        _LIB.define(name + schema)
        self.overload = getattr(torch.ops.helios, name).default
        _LIB.impl(name, body, "CompositeExplicitAutograd")
        register_cpu_body(qualname, body)
        functools.update_wrapper(self, body)

    def __call__(self, *args, **kwargs):
        return self.overload(*args, **kwargs)

    def register_kernel(self, device_type: str) -> Callable[[Callable], Callable]:
        """Decorator: `fn` is the op's kernel on `device_type` ("cuda")."""
        if device_type not in _DISPATCH_KEYS:
            raise ValueError(f"{self.qualname}: kernels are for {sorted(_DISPATCH_KEYS)}, got {device_type!r}")

        def register(fn: Callable) -> Callable:
            _LIB.impl(self.name, fn, _DISPATCH_KEYS[device_type])
            self.kernels[device_type] = fn
            return fn

        return register

    def register_fake(self, fn: Callable) -> Callable:
        """Decorator: `fn` computes the op's output metadata (fake tensors, ``Meta``)."""
        torch.library.register_fake(self.qualname, fn, lib=_LIB)
        return fn


def abi_op(qualname: str, *, mutates_args: Iterable[str], schema: str) -> Callable[[Callable], AbiOp]:
    """Decorator defining ``helios::NAME`` with `schema` (without its name, e.g. ``(Tensor x) ->
    Tensor``) and the decorated function as its body (module docstring)."""
    return lambda body: AbiOp(qualname, schema, mutates_args, body)


def _check_mutated(qualname: str, schema: torch._C.FunctionSchema, mutates_args: tuple) -> None:
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    if mutated != set(mutates_args):
        raise ValueError(f"{qualname}: the schema mutates {sorted(mutated)}, mutates_args names {sorted(mutates_args)}")

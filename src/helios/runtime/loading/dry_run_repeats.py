"""The precompile's dry run of a graph, each repeated call made once.

The dry run (`helios.runtime.loading.kernel_precompile`) runs a plan's graphs only to find the Triton
variants their launches need, and which variant a launch needs depends on its arguments' shapes,
strides, dtypes and alignment and on the numbers it is given, never on the values its tensors hold.
Every layer of a decoder calls the same ops on arguments alike in all of that, so a graph run call by
call repeats each layer's calls 31 times for a 32-layer model: an 8B core's first load spent 4.5-8 s
of its loading thread on them (bench/results/h200_session45_call1; the same on a warm Triton cache,
where nothing is compiled, bench/results/h200_session42_call6), its calls of the attention op, the
fused norm and the projections, on the critical path before the capture.

`run_skipping_repeats` walks a graph module as it would run and calls each node, except a call alike
in every argument (`call_key`) to one made before in the same plan: that call is not made, and its
result is the earlier call's. Only calls whose results are floating-point tensors made fresh are
skipped; the earlier result stands in for the skipped one's with the same shape, dtype and strides.
So a later call never reads an index or a count another call made, and the graph's bookkeeping
(integer tensors, views, calls that return what they write) runs as before. What is skipped:

- an op's call (its schema returns no alias of an argument; an op that takes a `ranks` count, a
  collective every rank must make alike, is always called), or a projection bound at capture
  (`SKIPPABLE_FUNCTIONS`: fresh results, no argument written);
- when an earlier call took arguments alike: tensors of the same shape, strides, dtype, device and
  16-byte alignment (what Triton specializes a pointer on), the same numbers, dtypes and strings.

What the dry run changes stays what it was: which launches are made, never a result. A variant a
skipped call would have needed and no other call revealed is compiled by its warm-up run, as a
variant the stand-ins did not reveal always was (the capture's report counts those).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

__all__ = ["SKIPPABLE_FUNCTIONS", "SKIP_REPEATS", "call_key", "run_skipping_repeats"]

SKIP_REPEATS = True  # the dry run makes each repeated call once (False: every call, as the graph runs)
# Python functions the capture binds into a graph (module.qualname) that return fresh tensors and write
# none of their arguments: the projections on the Triton kernels and cuBLASLt.
SKIPPABLE_FUNCTIONS = frozenset({
    "helios.abi.triton_skinny.skinny_linear", "helios.abi.triton_skinny.skinny_silu_linear",
    "helios.abi.triton_gemv.gemv_linear", "helios.abi.cublaslt.lt_linear",
})
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyable(Exception):
    """An argument `call_key` cannot describe: the call is made."""


def skippable(target) -> bool:
    """Whether calls of `target` may be skipped when repeated (see the module docstring)."""
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        return all(r.alias_info is None for r in schema.returns) and \
            not any(a.name == "ranks" for a in schema.arguments)
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
    return name in SKIPPABLE_FUNCTIONS


def call_key(target, args: tuple, kwargs: dict) -> tuple | None:
    """What decides the variants a call of `target` launches: its target and, for each argument, a
    tensor's shape, strides, dtype, device and whether its address is 16-byte aligned, or a plain
    value itself; None where an argument is none of those (the call is always made)."""
    try:
        return (target, _described(args), _described(tuple(sorted(kwargs.items()))))
    except _Unkeyable:
        return None


def _described(value) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, value.device, value.data_ptr() % 16 == 0)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_described(item) for item in value))
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    raise _Unkeyable(type(value).__name__)


def _fresh_floats(result) -> bool:
    """Whether `result` is floating-point tensors (or None) only: what a skipped call may be given."""
    if isinstance(result, torch.Tensor):
        return result.is_floating_point()
    if isinstance(result, (list, tuple)):
        return all(_fresh_floats(item) for item in result)
    return result is None


class _SkippingRepeats(torch.fx.Interpreter):
    """Runs a graph module node by node, skipping a repeated call (`seen`: key -> the earlier result,
    shared by the graphs of one plan)."""

    def __init__(self, module: torch.fx.GraphModule, seen: dict):
        super().__init__(module, garbage_collect_values=True)
        self.seen = seen
        self.skipped = 0

    def call_function(self, target, args, kwargs):
        key = call_key(target, args, kwargs) if skippable(target) else None
        if key is None:
            return super().call_function(target, args, kwargs)
        if key in self.seen:
            self.skipped += 1
            return self.seen[key]
        result = super().call_function(target, args, kwargs)
        if _fresh_floats(result):
            self.seen[key] = result
        return result


def run_skipping_repeats(module, arguments, seen: dict) -> int:
    """Runs `module` on `arguments` as its dry run (see the module docstring); `seen` carries the calls
    made across the graphs of one plan. Returns the calls skipped. A module that is not a graph module,
    or with `SKIP_REPEATS` off, is called as it is."""
    if not SKIP_REPEATS or not isinstance(module, torch.fx.GraphModule):
        module(*arguments)
        return 0
    runner = _SkippingRepeats(module, seen)
    runner.run(*arguments)
    return runner.skipped

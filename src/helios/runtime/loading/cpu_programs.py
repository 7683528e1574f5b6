"""Load-time preparation of a program for the CPU, where per-call Python overhead is the step time.

A small model's decode step on the CPU runs a few hundred tiny ops; what they cost is mostly the
Python and dispatcher work around them, not arithmetic. `cpu_program(module)` turns a loaded
program's graph module (``ExportedProgram.module()``) into a `CpuProgram` that computes exactly
the same values with less of it, once, at load (nothing is compiled, traced or exported):

- Direct ABI kernels. A call of a ``helios`` op goes through the dispatcher and its fallthrough
  keys before it reaches the op's Python body. On the CPU that body is the function
  `helios.abi.op_library` recorded for the op (`helios.abi.registry.register_cpu_body`), so the
  node calls it directly, with the same arguments (schema defaults filled in at load).
- Flat calls. The exported module flattens its (weight list, inputs...) arguments through a pytree
  spec and unflattens its outputs on every call; a `CpuProgram` regenerates the graph's code with
  plain positional inputs and calls it with the weight list unpacked.
- `helios.runtime.loading.graph_rewrites`: exact rewrites of op chains into fewer ops (rotary halves).
- Checked once. The first call runs that graph, whose ABI bodies check every argument (dtype,
  shape, device). The runtime calls a program with the same tensors every call
  (`helios.runtime.loading.model.program_arguments`), so a later call with those same tensors
  runs the program's fast graph (`helios.runtime.loading.cpu_fast`): unchecked bodies, step plans
  shared by every layer, sampling of the selected rows only, aten calls through torch's bindings.
  So does a call with other tensor objects of the same memory, shapes, strides, dtypes and devices
  (other views of the same buffers: what the checks read is the same). A call with other tensors
  runs the checked graph again (and makes them the checked ones).

Results are bit-for-bit those of the exported module: the same kernels run on the same values. A
load may then point the fast graph at C++ kernels for the ABI bodies (`bind_fast`,
`helios.runtime.loading.cpu_kernels`), whose results equal the bodies' within float rounding.
"""

from __future__ import annotations

from operator import is_
from typing import Any, Callable, Sequence

import torch

from helios.abi.registry import NAMESPACE, cpu_body
from helios.errors import ExecutionError
from helios.runtime.loading.cpu_fast import OP_META, fast_graph
from helios.runtime.loading.graph_rewrites import fuse_rotary_halves
from helios.runtime.loading.program_build import code_on_first_use, deferred_recompile, finish_recompile


class ProgramArgumentError(ExecutionError, ValueError):
    """A CPU program was called with a weight list of the wrong length (a runtime bug)."""


class CpuProgram:
    """A program's graph, code-generated once with flat inputs; called like the exported module
    (``program(weights, *inputs)``), it returns the tuple of its outputs. `graph` is the rewritten
    graph with checked ABI bodies (read-only by convention: editing it changes the generated code
    only after `recompile`); `fast` its fast module (None: every call is checked)."""

    def __init__(self, module: torch.fx.GraphModule, num_weights: int):
        self.module = module
        self.num_weights = num_weights
        self._binders: list[Callable[[torch.fx.Graph], int]] = []  # `bind_fast`, applied again by `recompile`
        self._derive()

    @property
    def graph(self) -> torch.fx.Graph:
        return self.module.graph

    def recompile(self) -> None:
        """Regenerates the code after an edit of `graph` (a load-time binding, e.g. of collectives)."""
        self.module.recompile()
        self._derive()

    def _derive(self) -> None:
        self._forward = self.module.forward
        graph = fast_graph(self.module.graph)
        if graph is not None:
            for binder in self._binders:
                binder(graph)
        self.fast = None if graph is None else _code_on_first_use(self.module, graph)
        # weights, their tensors, inputs, and the layouts of all of them (`_layout`)
        self._checked: tuple[Sequence[torch.Tensor], tuple, tuple, tuple] | None = None
        self._runner: torch.fx.GraphModule | None = None  # what calls with the checked tensors run
        self.compiled: torch.fx.GraphModule | None = None  # `use_compiled`
        self._compiled_for: tuple | None = None  # the tensors' layouts `compiled` takes

    def bind_fast(self, binder: Callable[[torch.fx.Graph], int]) -> int:
        """Applies `binder` (a load-time rewrite of call targets, e.g. to C++ kernels:
        `helios.runtime.loading.cpu_kernels`) to the fast graph, now and after every `recompile`;
        returns what it returns (how many calls it bound). Later calls run the rewritten graph."""
        self._binders.append(binder)
        if self.fast is None:
            return 0
        count = binder(self.fast.graph)
        self.fast.graph.lint()
        self.fast.recompile()
        self._checked = self._runner = None
        return count

    def use_compiled(self, module: torch.fx.GraphModule, tensors: Sequence[torch.Tensor]) -> None:
        """Makes `module` (the fast graph compiled at load for `tensors`, the weights then the
        inputs: `helios.runtime.loading.program_compile`) what later calls with tensors of the same
        memory, shapes, strides and dtypes run (views of the same buffers, as the runtime passes);
        calls with other tensors run the fast graph."""
        self.compiled, self._compiled_for = module, _layout(tensors)
        self._checked = self._runner = None

    def __call__(self, weights: Sequence[torch.Tensor], *inputs: torch.Tensor) -> Any:
        if len(weights) != self.num_weights:
            raise ProgramArgumentError(f"the program takes {self.num_weights} weights, got {len(weights)}")
        checked = self._checked
        if (checked is not None and checked[0] is weights and all(map(is_, weights, checked[1]))
                and len(inputs) == len(checked[2]) and all(map(is_, inputs, checked[2]))):
            return self._runner.forward(*weights, *inputs)  # no module-call machinery: no hooks are set
        if checked is not None and _layout((*weights, *inputs)) == checked[3]:  # other views of the checked memory
            self._checked = (weights, tuple(weights), inputs, checked[3])
            return self._runner.forward(*weights, *inputs)
        outputs = self._forward(*weights, *inputs)
        if self.fast is not None:
            layout = _layout((*weights, *inputs))
            self._checked = (weights, tuple(weights), inputs, layout)
            compiled = self.compiled is not None and layout == self._compiled_for
            self._runner = self.compiled if compiled else self.fast
        return outputs


def _code_on_first_use(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """The fast module of `graph`, its code generated when first called: the load binds its calls
    (`bind_fast`) and generates it then, so code made here would be made again."""
    with deferred_recompile():
        module = torch.fx.GraphModule(root, graph)
    return code_on_first_use(module)


def _layout(tensors: Sequence[torch.Tensor]) -> tuple:
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) for t in tensors)


def cpu_program(module: torch.fx.GraphModule) -> CpuProgram | torch.fx.GraphModule:
    """The `CpuProgram` of an exported program's module (see the module docstring), or `module`
    itself when its inputs are not (a list of weights, then tensors) as the runtime's are."""
    num_weights = _weights_first(module)
    if num_weights is None:
        return finish_recompile(module)
    graph = module.graph
    bind_abi_kernels(graph)
    fuse_rotary_halves(graph)
    graph._codegen = torch.fx.graph.CodeGen()  # positional placeholders, outputs returned as they are
    graph.lint()
    module.recompile()
    return CpuProgram(finish_recompile(module), num_weights)


def _weights_first(module: torch.fx.GraphModule) -> int | None:
    """How many weights the first (list) argument holds, when every other argument is one tensor."""
    codegen = module.graph._codegen
    info = getattr(codegen, "pytree_info", None)
    spec = getattr(info, "in_spec", None)
    if spec is None or getattr(info, "out_spec", None) is None:
        return None
    args = _children(spec)[0] if spec.type is tuple and spec.num_children == 2 else spec
    if args.type not in (tuple, list) or args.num_children < 1 or not _is_list_of_leaves(_children(args)[0]):
        return None
    if not all(_is_leaf(child) for child in _children(args)[1:]) or not _outputs_are_leaves(info.out_spec):
        return None
    kwargs = _children(spec)[1] if spec.type is tuple and spec.num_children == 2 else None
    if kwargs is not None and kwargs.num_children:
        return None
    return _children(args)[0].num_children


def _children(spec) -> list:
    children = getattr(spec, "children", None)  # a method in newer torch; older TreeSpecs hold children_specs
    return list(children() if callable(children) else spec.children_specs)


def _is_leaf(spec) -> bool:
    return spec.is_leaf()


def _is_list_of_leaves(spec) -> bool:
    return spec.type in (list, tuple) and all(_is_leaf(child) for child in _children(spec))


def _outputs_are_leaves(spec) -> bool:
    return spec.type in (list, tuple) and all(_is_leaf(child) for child in _children(spec))


def bind_abi_kernels(graph: torch.fx.Graph) -> int:
    """Points every call of a ``helios`` op that has no CPU-specific kernel at the op's Python
    body, with its arguments made positional (defaults filled in); returns how many were bound."""
    bound = 0
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target.namespace != NAMESPACE:
            continue
        op, body = node.target._schema.name, _cpu_body(node.target)
        arguments = _positional(node.target._schema, node.args, node.kwargs)
        if body is None or arguments is None:
            continue
        node.target, node.args, node.kwargs = body, arguments, {}
        node.meta[OP_META] = (op, body)  # what the fast graph rewrites (`helios.runtime.loading.cpu_fast`)
        bound += 1
    return bound


def _cpu_body(op: torch._ops.OpOverload) -> Callable | None:
    if op._overloadname != "default":
        return None
    return cpu_body(op._schema.name)


def _positional(schema, args: tuple, kwargs: dict) -> tuple | None:
    """The call's arguments in schema order, defaults filled in; None when one cannot be placed."""
    values = list(args)
    for argument in schema.arguments[len(args):]:
        if argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            return None
    if len(values) != len(schema.arguments) or set(kwargs) - {a.name for a in schema.arguments[len(args):]}:
        return None
    return tuple(values)

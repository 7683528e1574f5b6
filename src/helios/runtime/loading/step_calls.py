"""Capture-time collapse of a program's per-step bookkeeping into fewer launches (CUDA).

Around its layers a program computes the step's geometry and its sampling epilogue from small
per-row inputs (`helios.ignition.program`: query starts, cache slots, pending tokens, the logit bias,
counts, the completion record) with about a hundred aten calls. On a CUDA graph each is a kernel
of a microsecond or two plus the gap to the next, whatever its size: at batch 1 they are about a
twentieth of a decode step. `step_module` rewrites a copy of the graph, exactly:

- **repeated calls merged**: a pure aten call equal to an earlier one (same op, same arguments, after
  merging) is replaced by it, where no call between them writes what they read and nothing ever
  writes the result (``request_slots.clamp(min=0)`` is computed four times, each row's last token
  twice, ``sampled >= 0`` three times);
- **cache slots in one launch**: the traced slot mapping (eleven calls) becomes one
  `helios.abi.slots.packed_slots` call (`helios.runtime.loading.slot_calls`);
- **shape-only tensors made once**: ``zeros``, ``ones``, ``full``, ``arange`` and their ``*_like``
  forms of static shapes become constants of the module, computed here, where no call writes them;
- **integer accumulation in one launch**: ``index_put_(..., accumulate=True)`` calls
  `helios.abi.accumulate.accumulate_into` (atomic adds on an int32/int64 tensor; torch's path sorts
  first; anything else goes to ``index_put_`` itself);
- **dead calls dropped**: pure aten calls whose result nothing reads (a cast the trace left behind).

Which calls write what is read from the ops' schemas (an argument marked ``(a!)``); a value's
storage is followed through the calls whose schema says they return a view of an argument. A graph
calling a Python function that is not known to write nothing is left as it is (no merge and no
constant: its writes are unknown). Applied by `helios.runtime.loading.cuda_graphs` to each graph it
captures (after the sampling and rotary rewrites, which match the program's own structure), never
while serving.
"""

from __future__ import annotations

import copy
import operator
import sys
from typing import NamedTuple

import torch

from helios.abi.accumulate import accumulate_into
from helios.abi.sampling_rows import greedy_rows, greedy_rows_biased
from helios.abi.slots import packed_slots
from helios.runtime.loading.slot_calls import bind_packed_slots

__all__ = ["STEP_CALLS", "StepCallCounts", "collapse_step_calls", "step_module"]

# Whether `helios.runtime.loading.cuda_graphs` applies `step_module` at capture.
STEP_CALLS = True

_aten = torch.ops.aten
_FACTORIES = {_aten.zeros.default, _aten.ones.default, _aten.full.default, _aten.arange.default,
              _aten.arange.start, _aten.arange.start_step, _aten.zeros_like.default, _aten.ones_like.default,
              _aten.full_like.default}
_INDEX_PUT = _aten.index_put_.default
# Python arithmetic on sizes that export records (``page_table.shape[1] - 1``): no tensor involved.
_SYMBOLIC = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
             operator.truediv, operator.pow, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
             operator.ge)


def _known_pure() -> set:
    """Python functions a program graph may call that write none of their arguments and return
    fresh tensors (the loading passes' bindings; `greedy_rows_biased` puts back the entries it sets
    aside before it returns, so no later call sees a write)."""
    known = {greedy_rows, greedy_rows_biased, operator.getitem, *_SYMBOLIC}
    gemv = sys.modules.get("helios.abi.triton_gemv")  # imported by whatever bound a call to it, else none is bound
    return known | {packed_slots} | ({gemv.gemv_linear} if gemv is not None else set())


class StepCallCounts(NamedTuple):
    """How many calls each rewrite changed."""

    slots: int
    merged: int
    constants: int
    accumulations: int
    dropped: int

    @property
    def total(self) -> int:
        return sum(self)


def step_module(module, device: torch.device | None = None, enabled: bool | None = None, in_place: bool = False):
    """A module computing `module`'s program with its bookkeeping collapsed (a new graph sharing
    `module`'s attributes, plus its constants), or `module` itself when nothing changes, it has no
    graph, or the rewrite is not `enabled` (default: `STEP_CALLS`). `device`: where the constants
    live (the program's; default: the first tensor attribute's device, else the CPU). `in_place`:
    the caller owns `module` (a copy nothing else uses), which is rewritten and returned itself,
    without copying its graph."""
    enabled = STEP_CALLS if enabled is None else enabled
    if not enabled or not isinstance(module, torch.fx.GraphModule):
        return module
    rewritten = module if in_place else torch.fx.GraphModule(module, copy.deepcopy(module.graph))
    counts = collapse_step_calls(rewritten, device or _module_device(module))
    return rewritten if counts.total else module


def collapse_step_calls(module: torch.fx.GraphModule, device: torch.device) -> StepCallCounts:
    """Applies the rewrites of the module docstring to `module`'s graph in place (constants become
    its buffers, on `device`) and recompiles it; returns the counts."""
    graph = module.graph
    slots = bind_packed_slots(graph)
    dropped = _drop_dead(graph) if slots else 0  # the traced mapping's calls, before constants are made of them
    known = _known_pure()
    if any(n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload) and n.target not in known
           for n in graph.nodes):
        counts = StepCallCounts(slots, 0, 0, _bind_accumulations(graph), dropped + _drop_dead(graph))
    else:
        storage = _Storage(graph)
        merged = _merge_repeats(graph, storage)
        constants = _make_constants(module, graph, storage, device)
        counts = StepCallCounts(slots, merged, constants, _bind_accumulations(graph), dropped + _drop_dead(graph))
    if counts.total:
        graph.lint()
        module.recompile()
    return counts


class _Storage:
    """Which storage each value of a graph lives in, and which storages its calls write."""

    def __init__(self, graph: torch.fx.Graph):
        self.root: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in graph.nodes:
            self.root[node] = self._root_of(node)
        self.written = {root for node in graph.nodes for root in self.writes(node)}

    def _root_of(self, node: torch.fx.Node) -> torch.fx.Node:
        """The value whose storage `node` views (itself when it is a fresh tensor)."""
        if node.op != "call_function":
            return node
        if node.target is operator.getitem:  # an output of a multi-output call lives where the call's do
            source = node.args[0]
            return self.root.get(source, source) if isinstance(source, torch.fx.Node) else node
        schema = _schema(node)
        aliases = [r.alias_info for r in schema.returns if r.alias_info is not None] if schema is not None else []
        if not aliases:
            return node
        alias = aliases[0]
        for argument, value in zip(schema.arguments, node.args):
            # a list of views (``split``) carries its alias set on the elements: any aliased argument
            shared = argument.alias_info is not None and (not alias.before_set
                                                          or argument.alias_info.before_set & alias.before_set)
            if shared and isinstance(value, torch.fx.Node):
                return self.root.get(value, value)
        return node

    def writes(self, node: torch.fx.Node) -> set:
        """Storages `node` writes: its schema's ``(a!)`` arguments (every tensor argument of an op
        without a schema that is not known to be pure)."""
        if node.op != "call_function":
            return set()
        schema = _schema(node)
        if schema is None:
            return set()  # a known pure Python function (others stop `collapse_step_calls` early)
        written = set()
        for argument, value in zip(schema.arguments, node.args):
            # an op that returns nothing is called for what it writes: all its tensors, declared or not
            if not schema.returns or (argument.alias_info is not None and argument.alias_info.is_write):
                written |= {self.root.get(n, n) for n in _nodes_in(value)}
        return written

    def reads(self, node: torch.fx.Node) -> set:
        return {self.root.get(n, n) for n in node.all_input_nodes}


def _merge_repeats(graph: torch.fx.Graph, storage: _Storage) -> int:
    """Replaces every pure aten call equal to an earlier one whose inputs nothing wrote in between."""
    seen: dict[tuple, torch.fx.Node] = {}
    # storage -> keys of `seen` whose call reads it (a key's reads follow from its arguments, so an
    # index entry left by a forgotten key names what the same key would read again)
    readers: dict[torch.fx.Node, set] = {}
    merged = 0
    for node in list(graph.nodes):
        for root in storage.writes(node):  # forget what read a storage this call writes
            for key in readers.pop(root, ()):
                seen.pop(key, None)
        if not _is_pure_aten(node) or storage.root[node] in storage.written:
            continue
        key = (node.target, _frozen(node.args), _frozen(node.kwargs))
        kept = seen.get(key)
        if kept is None:
            seen[key] = node
            for root in storage.reads(node):
                readers.setdefault(root, set()).add(key)
            continue
        node.replace_all_uses_with(kept)
        graph.erase_node(node)
        merged += 1
    return merged


def _make_constants(module: torch.fx.GraphModule, graph: torch.fx.Graph, storage: _Storage,
                    device: torch.device) -> int:
    """Replaces each shape-only factory call of static shape that nothing writes by a buffer."""
    made = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _FACTORIES or storage.root[node] in storage.written \
                or any(user.op == "output" for user in node.users):
            continue
        value = _factory_value(node, device)
        if value is None:
            continue
        name = f"_step_constant_{made}"
        while hasattr(module, name):
            name += "_"
        module.register_buffer(name, value, persistent=False)
        with graph.inserting_before(node):
            constant = graph.get_attr(name)
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
        made += 1
    return made


def _factory_value(node: torch.fx.Node, device: torch.device) -> torch.Tensor | None:
    """The factory's result, computed with a stand-in of its (static) input, or None."""
    expected = node.meta.get("val")
    if not isinstance(expected, torch.Tensor) or not _static(expected):
        return None
    args = list(node.args)
    if node.target in (_aten.zeros_like.default, _aten.ones_like.default, _aten.full_like.default):
        source = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
        if not isinstance(source, torch.Tensor) or not _static(source):
            return None
        args[0] = torch.empty_strided(tuple(source.shape), tuple(source.stride()), dtype=source.dtype, device=device)
    if _nodes_in(args) or _nodes_in(dict(node.kwargs)):
        return None  # a size or fill value computed by the graph
    value = node.target(*args, **node.kwargs)
    if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
        return None
    return value


def _bind_accumulations(graph: torch.fx.Graph) -> int:
    """Points every accumulating ``index_put_`` at `accumulate_into` (which runs ``index_put_`` itself
    for what its kernel does not cover: a float tensor, say). The target's dtype is not read here: a
    graph built straight from its image has no meta value where a shape is symbolic (the count
    tables' slot dimension)."""
    calls = [node for node in graph.nodes if node.op == "call_function" and node.target is _INDEX_PUT
             and len(node.args) == 4 and node.args[3] is True and not node.kwargs]
    if not calls:
        return 0
    for node in calls:
        node.target = accumulate_into
        node.args = node.args[:3]
    return len(calls)


def _drop_dead(graph: torch.fx.Graph) -> int:
    """Erases pure aten calls nothing reads (repeatedly: their inputs may then be unread)."""
    dropped = 0
    for node in reversed(list(graph.nodes)):
        if not node.users and _is_pure_aten(node):
            graph.erase_node(node)
            dropped += 1
    return dropped


def _is_pure_aten(node: torch.fx.Node) -> bool:
    """A call of an aten op that writes nothing and draws nothing at random."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target.namespace != "aten" or torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    schema = node.target._schema
    name = node.target.name()
    return not schema.is_mutable and bool(schema.returns) and "empty" not in name \
        and not name.startswith(("aten::_assert", "aten::sym_constrain"))


def _schema(node: torch.fx.Node):
    return node.target._schema if isinstance(node.target, torch._ops.OpOverload) else None


def _nodes_in(value) -> list:
    nodes = []
    torch.fx.node.map_arg(value, nodes.append)
    return nodes


def _frozen(value):
    """A hashable form of call arguments (nodes by identity)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return ("const", str(value))
    if isinstance(value, float):
        return ("float", value, str(value))  # 0.0 and -0.0 stay apart; NaN equals itself as text
    return (type(value).__name__, value)


def _static(value: torch.Tensor) -> bool:
    return all(isinstance(size, int) for size in value.shape) and all(isinstance(s, int) for s in value.stride())


def _module_device(module: torch.nn.Module) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")

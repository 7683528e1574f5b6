"""The compilable segments of a CPU program's fast graph (`helios.runtime.loading.program_compile`).

A fast graph (`helios.runtime.loading.cpu_fast`) mixes three kinds of calls:

- compiled: pure tensor ops (aten overloads without mutation, torch's bindings of them) and the
  pure ABI bodies listed in `PURE_BODIES` (norms, SiLU-mul, the rotation of q and k, the
  completion record's columns), which Inductor traces into aten and fuses;
- free: views of inputs and items of an opaque call's result (no work; they run eagerly where
  their inputs are ready);
- opaque: everything else, run eagerly as the fast graph runs it: the ABI bodies that read plans
  on the host or write buffers (attention, cache writes, sampling), in-place
  ops, calls of modules.

`segment_graph` rewrites a copy of the graph so that the compiled calls form as few runs as
possible: the rotary cache write splits into a compiled rotation and an opaque cache write; the
sizes of inputs become constants (the program is compiled for the runtime's tensors, the same
every call); opaque calls keep their order, and each compiled or free call moves to the earliest
point where its inputs exist and no opaque call that precedes it in the original order writes
what it reads. `compiled_runs` lists the runs, in graph order.
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch

from helios.abi import cpu_bodies

_aten = torch.ops.aten
_VIEWS = frozenset({
    torch.select, torch.reshape, torch.Tensor.view, torch.unsqueeze, torch.squeeze, torch.transpose,
    torch.permute, torch.Tensor.expand, torch.split_with_sizes, operator.getitem, _aten.slice.Tensor,
    _aten.select.int, _aten.view.default, _aten.reshape.default, _aten.unsqueeze.default,
})
_SIZES = frozenset({torch.Tensor.size, _aten.sym_size.int})
_FOLDED = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg})
_TORCH_METHODS = frozenset({torch.Tensor.to, torch.Tensor.view, torch.Tensor.expand, torch.Tensor.contiguous})


def signed_sine(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated (`cpu_bodies.plan_rotary`'s factor)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` as `cpu_bodies._rotate` computes it, a fresh tensor."""
    return x * cos + x.roll(signed_sin.shape[-1] // 2, -1) * signed_sin


PURE_BODIES = frozenset({cpu_bodies.rms_norm, cpu_bodies.add_rms_norm, cpu_bodies.silu_mul,
                         cpu_bodies.gelu_tanh_mul, cpu_bodies.completion_record, signed_sine, rotate})


def segment_graph(graph: torch.fx.Graph, inputs: dict[str, torch.Tensor]) -> torch.fx.Graph:
    """A rewritten copy of `graph` (see the module docstring); `inputs` maps placeholder names to
    the tensors the program is compiled for."""
    copied = torch.fx.Graph()
    copied._codegen = graph._codegen
    nodes: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.nodes:
        nodes[node] = copied.node_copy(node, lambda arg: nodes[arg])
    split_rotary(copied)
    fold_sizes(copied, inputs)
    reorder(copied)
    copied.lint()
    return copied


def is_compiled(node: torch.fx.Node) -> bool:
    """A pure tensor call that is not free (see the module docstring)."""
    return _pure(node) and not is_free(node)


def is_free(node: torch.fx.Node) -> bool:
    """A view of an input or of an opaque call's result, or an item of the latter (no work)."""
    if node.op != "call_function" or node.target not in _VIEWS:
        return False
    source = node.args[0]
    if not isinstance(source, torch.fx.Node):
        return False
    return source.op == "placeholder" or is_free(source) or not _pure(source)


def _pure(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target in PURE_BODIES:
        return True
    if target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and _pure(node.args[0])
    if target in _SIZES:
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace == "aten" and not target._schema.is_mutable
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return False  # in place
    return target in _TORCH_METHODS or (getattr(target, "__module__", None) or "").startswith("torch")


def split_rotary(graph: torch.fx.Graph) -> int:
    """Each ``rotary_cache_write_planned(q, k, v, kc, vc, plan_rotary(cos, sin, slots))`` becomes
    the compiled rotations of q and k and an opaque ``cache_write_planned`` of the rotated k;
    returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not cpu_bodies.rotary_cache_write_planned:
            continue
        q, k, v, k_cache, v_cache, plan = node.args
        if not (isinstance(plan, torch.fx.Node) and plan.target is cpu_bodies.plan_rotary):
            continue
        cos, sin, slots = plan.args
        with graph.inserting_before(node):
            signed = graph.call_function(signed_sine, (sin,))
            rotated_q = graph.call_function(rotate, (q, cos, signed))
            rotated_k = graph.call_function(rotate, (k, cos, signed))
            graph.call_function(cpu_bodies.cache_write_planned, (k_cache, v_cache, rotated_k, v, slots))
        node.replace_all_uses_with(rotated_q)
        graph.erase_node(node)
        if not plan.users:
            graph.erase_node(plan)
        count += 1
    return count


def fold_sizes(graph: torch.fx.Graph, inputs: dict[str, torch.Tensor]) -> int:
    """Replaces the sizes of inputs, and integer arithmetic on them, by their values; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _SIZES and isinstance(node.args[0], torch.fx.Node) and node.args[0].name in inputs:
            value = inputs[node.args[0].name].size(*node.args[1:])
        elif node.target in _FOLDED and not any(isinstance(a, torch.fx.Node) for a in node.args) and not node.kwargs:
            value = node.target(*node.args)
        else:
            continue
        if not isinstance(value, int):
            continue
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=node, v=value: v if a is n else a)
        graph.erase_node(node)
        count += 1
    return count


def reorder(graph: torch.fx.Graph) -> None:
    """Orders the calls by level: opaque call k (in the original order) opens level k; a compiled
    or free call joins the highest level among its inputs and the opaque calls before it that
    take what it reads (the same tensor, through views); within a level the opaque call comes
    first, then the free calls, then the compiled ones, each in the original order."""
    calls = [node for node in graph.nodes if node.op not in ("placeholder", "output", "get_attr")]
    level: dict[torch.fx.Node, int] = {}
    touched: list[tuple[int, set]] = []  # (level, the bases an opaque call takes)
    rank: dict[torch.fx.Node, int] = {}
    for node in calls:
        arguments = _arguments(node)
        if is_compiled(node) or is_free(node):
            reads = {_base(a) for a in arguments}
            found = max((level.get(a, 0) for a in arguments), default=0)
            found = max([found] + [k for k, bases in touched if reads & bases])
            level[node], rank[node] = found, 2 if is_compiled(node) else 1
        else:
            level[node], rank[node] = len(touched) + 1, 0
            touched.append((level[node], {_base(a) for a in arguments}))
    output = next(node for node in graph.nodes if node.op == "output")
    for node in sorted(calls, key=lambda n: (level[n], rank[n])):  # stable: the original order within
        output.prepend(node)


def compiled_runs(graph: torch.fx.Graph) -> list[list[torch.fx.Node]]:
    """The maximal runs of consecutive compiled calls, in graph order."""
    runs: list[list[torch.fx.Node]] = []
    current: list[torch.fx.Node] = []
    for node in graph.nodes:
        if is_compiled(node):
            current.append(node)
            continue
        if current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def run_boundary(run: Sequence[torch.fx.Node]) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """(inputs, outputs) of a run: the nodes outside it that it reads (in first-use order), and its
    nodes read outside it (in graph order)."""
    members = set(run)
    inputs: dict[torch.fx.Node, None] = {}
    for node in run:
        for argument in _arguments(node):
            if argument not in members:
                inputs.setdefault(argument)
    outputs = [node for node in run if any(user not in members for user in node.users)]
    return list(inputs), outputs


def _arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def _base(node):
    """The node a view chain starts from (an input, or the call that made the tensor)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node

"""Capture-time fusion of consecutive small integer elementwise calls into one generated Triton kernel
(CUDA; measured before it is served: `FUSE_RUNS` is off).

After `helios.runtime.loading.step_calls` a decode step's bookkeeping still holds runs of two to four
elementwise calls on one [R] tensor shape (``where``, ``ge``, ``clamp``, ``to``, ``sub``, ``add``) between
its gathers and accumulations, one launch each. `fuse_runs` replaces each run of consecutive such
calls (integer and boolean values only, no broadcasting, static contiguous shapes) by one call of a
kernel generated for it: the same integer arithmetic (C integer semantics, as torch's), the values
of ``where`` selected, not computed. The run's calls are kept as a small graph the launcher runs
instead where the kernel does not apply (another device, non-contiguous inputs): exact either way.
Kernels are generated and compiled at capture (the warm-up), never while serving.
"""

from __future__ import annotations

import copy
import linecache
import operator

import torch

__all__ = ["FUSE_RUNS", "fuse_runs", "runs_module"]

FUSE_RUNS = False

_aten = torch.ops.aten
_COMPARE = {_aten.ge.Scalar: ">=", _aten.gt.Scalar: ">", _aten.lt.Scalar: "<", _aten.le.Scalar: "<=",
            _aten.eq.Scalar: "==", _aten.ne.Scalar: "!=", _aten.ge.Tensor: ">=", _aten.gt.Tensor: ">",
            _aten.lt.Tensor: "<", _aten.le.Tensor: "<=", _aten.eq.Tensor: "==", _aten.ne.Tensor: "!="}
_ARITHMETIC = {_aten.add.Tensor: "+", _aten.sub.Tensor: "-"}
_INTEGER = (torch.int32, torch.int64)
_VALUES = (torch.bool, torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.float16)
_TL = {torch.bool: "tl.int1", torch.int32: "tl.int32", torch.int64: "tl.int64"}
_BLOCK = 256
_generated = [0]


def runs_module(module, enabled: bool | None = None, in_place: bool = False):
    """A module computing `module`'s program with its runs fused (a new graph sharing its attributes),
    or `module` itself when it has none (found before any copy is made), no graph, or fusion is not
    `enabled` (default: `FUSE_RUNS`). `in_place`: the caller owns `module` (a copy nothing else uses),
    which is rewritten, recompiled and returned itself, without copying its graph."""
    enabled = FUSE_RUNS if enabled is None else enabled
    if not enabled or not isinstance(module, torch.fx.GraphModule) or not _runs(module.graph):
        return module
    if in_place:
        fuse_runs(module.graph)
        module.recompile()
        return module
    graph = copy.deepcopy(module.graph)
    fuse_runs(graph)
    return torch.fx.GraphModule(module, graph)


def fuse_runs(graph: torch.fx.Graph) -> int:
    """Replaces each run of two or more consecutive fusable calls by one generated kernel's call;
    returns how many runs. The caller recompiles."""
    runs = _runs(graph)
    for run in runs:
        _replace(graph, run)
    return len(runs)


def _runs(graph: torch.fx.Graph) -> list:
    """The runs of two or more consecutive fusable calls of one shape, in graph order (reads only)."""
    runs, current = [], []
    for node in graph.nodes:
        if node.op in ("get_attr", "placeholder"):
            continue  # no launch: a run goes on across them
        if _fusable(node) and (not current or _shape(node) == _shape(current[0])):
            current.append(node)
            continue
        runs.append(current)
        current = [node] if _fusable(node) else []
    runs.append(current)
    return [run for run in runs if len(run) >= 2]


def _fusable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.kwargs and set(node.kwargs) != {"dtype"}:
        return False
    value = node.meta.get("val")
    if not _plain(value) or node.target not in (*_COMPARE, *_ARITHMETIC, _aten.where.self, _aten.clamp.default,
                                                _aten.to.dtype):
        return False
    tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
    if any(not _plain(a.meta.get("val")) or tuple(a.meta["val"].shape) != tuple(value.shape) for a in tensors):
        return False
    scalars = [a for a in node.args[1:] if not isinstance(a, torch.fx.Node)]
    if node.target is _aten.to.dtype:
        return value.dtype in _INTEGER and node.args[0].meta["val"].dtype in (torch.bool, *_INTEGER) \
            and len(node.args) == 2
    if any(not (a is None or (isinstance(a, int) and not isinstance(a, bool))) for a in scalars):
        return False
    if node.target is _aten.where.self:
        return len(tensors) == 3 and tensors[0].meta["val"].dtype == torch.bool \
            and tensors[1].meta["val"].dtype == tensors[2].meta["val"].dtype == value.dtype
    return all(a.meta["val"].dtype in _INTEGER for a in tensors) and value.dtype in (torch.bool, *_INTEGER)


def _plain(value) -> bool:
    return (isinstance(value, torch.Tensor) and value.dtype in _VALUES and value.dim() >= 1
            and all(isinstance(s, int) for s in value.shape) and value.is_contiguous())


def _shape(node: torch.fx.Node) -> tuple:
    return tuple(node.meta["val"].shape)


def _replace(graph: torch.fx.Graph, run: list) -> None:
    members = set(run)
    inputs = []
    for node in run:
        for arg in node.all_input_nodes:
            if arg not in members and arg not in inputs:
                inputs.append(arg)
    outputs = [node for node in run if any(user not in members for user in node.users)]
    fallback = _subgraph(run, inputs, outputs)
    launcher = _Launcher(_generate(run, inputs, outputs), fallback, [n.meta["val"] for n in outputs])
    with graph.inserting_after(run[-1]):
        call = graph.call_function(launcher, tuple(inputs))
    picked = []
    with graph.inserting_after(call):
        for index, node in enumerate(outputs):
            picked.append(graph.call_function(operator.getitem, (call, index)))
    for node, value in zip(outputs, picked):
        value.meta = dict(node.meta)
        node.replace_all_uses_with(value)
    for node in reversed(run):
        graph.erase_node(node)


def _subgraph(run: list, inputs: list, outputs: list) -> torch.fx.GraphModule:
    """The run's calls as their own module (the launcher's fallback)."""
    graph = torch.fx.Graph()
    mapping = {node: graph.placeholder(f"in_{i}") for i, node in enumerate(inputs)}
    for node in run:
        mapping[node] = graph.node_copy(node, lambda n: mapping[n])
    graph.output(tuple(mapping[node] for node in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _generate(run: list, inputs: list, outputs: list):
    """A Triton kernel computing the run elementwise: (inputs..., outputs..., n, BLOCK)."""
    import triton  # noqa: F401  (the generated source imports it)

    lines = ["    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    live = at < n"]
    for i in range(len(inputs)):
        lines.append(f"    v_in_{i} = tl.load(in_{i} + at, mask=live)")
    value = {node: f"v_in_{i}" for i, node in enumerate(inputs)}
    for index, node in enumerate(run):
        value[node] = f"t{index}"
        lines.append(f"    t{index} = {_expression(node, value)}")
    for i, node in enumerate(outputs):
        lines.append(f"    tl.store(out_{i} + at, {value[node]}, mask=live)")
    parameters = [f"in_{i}" for i in range(len(inputs))] + [f"out_{i}" for i in range(len(outputs))]
    _generated[0] += 1
    name = f"_run_kernel_{_generated[0]}"
    source = "\n".join([f"def {name}({', '.join(parameters)}, n, BLOCK: tl.constexpr):", *lines]) + "\n"
    filename = f"<helios elementwise run {_generated[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # triton reads the source
    scope: dict = {}
    exec(compile("import triton\nimport triton.language as tl\n", filename + " imports", "exec"), scope)
    exec(compile(source, filename, "exec"), scope)
    return scope["triton"].jit(scope[name])


def _expression(node: torch.fx.Node, value: dict) -> str:
    args = [value[a] if isinstance(a, torch.fx.Node) else repr(a) for a in node.args]
    target = node.target
    if target in _COMPARE:
        return f"{args[0]} {_COMPARE[target]} {args[1]}"
    if target in _ARITHMETIC:
        return f"{args[0]} {_ARITHMETIC[target]} {args[1]}"
    if target is _aten.where.self:
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    if target is _aten.to.dtype:
        return f"{args[0]}.to({_TL[node.args[1]]})"
    low, high = (node.args + (None, None))[1:3]
    text = args[0]
    if low is not None:
        text = f"tl.maximum({text}, {args[1]})"
    if high is not None:
        text = f"tl.minimum({text}, {args[2]})"
    return text


class _Launcher:
    """The run's kernel on CUDA contiguous inputs; its calls (the fallback module) otherwise."""

    def __init__(self, kernel, fallback, outputs: list):
        self.kernel, self.fallback = kernel, fallback
        self.outputs = [(tuple(v.shape), v.dtype) for v in outputs]
        self.__name__ = self.__qualname__ = f"elementwise_run_{_generated[0]}"  # how the graph's code names it
        self.__module__ = __name__

    def __call__(self, *inputs):
        if not all(t.is_cuda and t.is_contiguous() for t in inputs):
            return tuple(self.fallback(*inputs))
        return self.launch(*inputs)

    def launch(self, *inputs):
        """The kernel (CPU tensors under the interpreter)."""
        device = inputs[0].device
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs]
        count = outputs[0].numel()
        self.kernel[(max(1, -(-count // _BLOCK)),)](*inputs, *outputs, count, BLOCK=_BLOCK)
        return tuple(outputs)

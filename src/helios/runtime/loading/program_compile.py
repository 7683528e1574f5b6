"""Compiling CPU programs ahead, at load, with torch Inductor (`LoadOptions.compile_programs`).

On the CPU a small model's decode step is dozens of tiny eager calls (norms, rotary, index
arithmetic) between its matrix products. `compile_programs` compiles, for each CPU program with a
fast graph (`helios.runtime.loading.cpu_fast`), the runs of pure tensor calls between its opaque
calls (`helios.runtime.loading.compile_segments`) with Inductor into fused C++ kernels, for the
exact tensors the runtime calls it with (`program_arguments`: the same shapes every call, so
nothing is traced or compiled again). The opaque calls (attention over the step's plan, cache
writes, sampling, completion records) run as the fast graph runs them, but for a full decode
step's attention, which runs a C++ kernel built at load
(`helios.runtime.loading.decode_attention_kernel`), the cache writes, which copy through
another (`helios.runtime.loading.cache_write_kernel`), and sampling, whose greedy steps a third
decides (`helios.runtime.loading.greedy_kernel`); so do the projections
`helios.runtime.loading.packed_linears` measures faster through oneDNN's packed weights (the
segments form around them). A segment's contiguous output is passed to the next without a copy,
and views nothing reads are dropped.

Everything is compiled before the engine reports ready; serving compiles nothing. A program is
still checked once: its first call runs the checked graph, and later calls with tensors of the
compiled memory and layouts run the compiled graph (`CpuProgram.use_compiled`); other tensors run
the eager fast graph. Results equal the eager program's within float rounding (fused kernels add and
reduce in another order); greedy tokens are the same in the tests' workloads.

Without a C++ compiler, or when Inductor fails on a program, loading fails with
`ProgramCompileError` rather than serving slower than asked: the option is explicit.
Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the system's temp directory)
makes a second load of the same programs faster.
"""

from __future__ import annotations

import operator
import time
from typing import Callable, Iterable, Sequence

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from helios.errors import LoadError
from helios.runtime.loading.compile_segments import (
    compiled_runs, is_compiled, is_free, reorder, run_boundary, segment_graph,
)
from helios.runtime.loading import cache_write_kernel, greedy_kernel
from helios.runtime.loading.cpp_kernels import compiler_available
from helios.runtime.loading.cpu_programs import CpuProgram
from helios.runtime.loading.decode_attention_kernel import bind_decode_attention, build_kernel
from helios.runtime.loading.packed_linears import pack_linears
from helios.runtime.loading.segment_calls import compile_segment
from helios.runtime.loading.vector_isa import settle_vector_isa


class ProgramCompileError(LoadError):
    """Programs could not be compiled at load (no C++ compiler, or Inductor failed on a program)."""


def compile_programs(programs: Iterable, arguments: Callable[[object], list],
                     progress: Callable[[str], None] | None = None) -> int:
    """Compiles every `CpuProgram` among `programs` (`LoadedProgram`s) for the tensors
    `arguments(program)` returns; returns how many. Raises `ProgramCompileError`."""
    chosen = [p for p in programs if isinstance(p.module, CpuProgram) and p.module.fast is not None]
    if not chosen:
        return 0
    if compiler_available() is None:
        raise ProgramCompileError("--compile-programs needs a C++ compiler for Inductor (g++ or clang++ on PATH, "
                                  "or CXX); install one or serve without compiling programs")
    settle_vector_isa(compiler_available())  # Inductor's vector set: probed once per machine
    say = progress or (lambda line: None)
    started = time.perf_counter()
    packed: dict = {}  # packed projection weights, shared between the programs
    for index, program in enumerate(chosen, 1):
        label = f"{program.graph} (batch {program.batch_capacity}, {program.packed_token_capacity} tokens)"
        begun = time.perf_counter()
        say(f"compiling program {index}/{len(chosen)}: {label}")
        try:
            compile_program(program.module, arguments(program), packed)
        except ProgramCompileError:
            raise
        except Exception as error:  # Inductor's failures have no common type
            raise ProgramCompileError(f"compiling program {label} failed: {type(error).__name__}: {error}") from error
        say(f"compiled {label} in {time.perf_counter() - begun:.1f} s")
    say(f"compiled {len(chosen)} programs in {time.perf_counter() - started:.1f} s")
    return len(chosen)


def compile_program(program: CpuProgram, arguments: Sequence, packed: dict | None = None) -> torch.fx.GraphModule:
    """Compiles `program`'s fast graph for `arguments` (its weight list, then its inputs) and
    makes it the graph later calls with tensors of this memory and these layouts run (the
    runtime's views of the same buffers); returns the module. Projections where oneDNN's packed
    weights pay run through them (`helios.runtime.loading.packed_linears`; `packed` shares the
    packed weights between programs)."""
    kernel = build_kernel()  # the decode attention kernel (built once per process)
    writes = cache_write_kernel.build_kernel()  # the cache write kernel
    greedy = greedy_kernel.build_kernel()  # the greedy sampling kernel
    weights, *inputs = arguments
    tensors = (*weights, *inputs)
    placeholders = [node for node in program.fast.graph.nodes if node.op == "placeholder"]
    if len(placeholders) != len(tensors):
        raise ProgramCompileError(f"the program takes {len(placeholders)} tensors, got {len(tensors)}")
    real = {node.name: tensor for node, tensor in zip(placeholders, tensors)}
    graph = segment_graph(program.fast.graph, real)
    values = _fake_values(graph, real, placeholders)
    module = torch.fx.GraphModule(program.fast, graph)
    if pack_linears(module, graph, real, values, packed):  # opaque calls now: the segments form around them
        reorder(graph)
        values = _fake_values(graph, real, placeholders)
    contiguous: set = set()
    for number, run in enumerate(compiled_runs(graph)):
        _compile_run(module, graph, run, values, real, number, contiguous)
    _bind_fixed_views(module, graph, real)
    _drop_unused_views(graph)
    bind_decode_attention(graph, kernel)
    cache_write_kernel.bind_cache_writes(graph, writes)
    greedy_kernel.bind_greedy_sampling(graph, greedy)
    graph.lint()
    module.recompile()
    program.use_compiled(module, tensors)
    return module


def _compile_run(module, graph: torch.fx.Graph, run: list, values: dict, real: dict, number: int,
                 contiguous: set) -> None:
    """Replaces the run's nodes by one call of its Inductor-compiled graph. `contiguous`: the
    outputs of compiled runs that are contiguous tensors (this run's are added)."""
    inputs, outputs = run_boundary(run)
    if not outputs:
        return
    fixed = {node: _fixed_value(node, real) for node in inputs}
    sub = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {node: sub.placeholder(f"input_{i}") for i, node in enumerate(inputs)}
    for node in run:
        copies[node] = sub.node_copy(node, lambda arg: copies[arg])
    sub.output(tuple(copies[node] for node in outputs))
    examples = []
    for node in inputs:
        value = fixed[node] if fixed[node] is not None else values.get(node)
        if not isinstance(value, torch.Tensor):
            raise ProgramCompileError(f"segment {number} reads {node.name}, which is not a tensor of known shape")
        examples.append(value if fixed[node] is not None else torch.zeros(value.shape, dtype=value.dtype))
    segment, _ = compile_segment(torch.fx.GraphModule(module, sub), examples, f"compiled_segment_{number}")
    with torch.inference_mode():  # the layouts the compiled call returns (the same every call)
        produced = segment(*examples)
    with graph.inserting_before(run[0]):
        # A tensor made by an opaque call is passed contiguous, as compiled; so is another segment's
        # output unless the compiled call returns it contiguous (`contiguous`).
        passed = [node if fixed[node] is not None or node in contiguous
                  else graph.call_function(torch.Tensor.contiguous, (node,)) for node in inputs]
        call = graph.call_function(segment, tuple(passed))
        results = [graph.call_function(operator.getitem, (call, index)) for index in range(len(outputs))]
    for node, result, made in zip(outputs, results, produced):
        values[result] = values.get(node)
        if _contiguous(values[result]) and _contiguous(made) and made.shape == values[result].shape:
            contiguous.add(result)
        node.replace_all_uses_with(result, delete_user_cb=lambda user: user not in run)
    for node in reversed(run):
        graph.erase_node(node)


def _contiguous(value) -> bool:
    """Whether a static fake value is a tensor laid out as ``contiguous()`` would return it."""
    return isinstance(value, torch.Tensor) and value.is_contiguous()


def _bind_fixed_views(module: torch.nn.Module, graph: torch.fx.Graph, real: dict) -> int:
    """Replaces each view of an input (the same view every call: the compiled graph runs only
    on tensors of the compile-time storage and layout) by that view, held by `module`; returns
    how many. A write through it writes the input, as before."""
    count = 0
    for node in list(graph.nodes):
        if not (is_free(node) and node.users):
            continue
        value = _fixed_value(node, real)
        if value is None:
            continue
        name = f"fixed_view_{count}"
        module.register_buffer(name, value, persistent=False)
        with graph.inserting_before(node):
            fixed = graph.get_attr(name)
        node.replace_all_uses_with(fixed)
        graph.erase_node(node)
        count += 1
    return count


def _drop_unused_views(graph: torch.fx.Graph) -> int:
    """Erases the free calls (views, no work) whose result nothing reads (a view the exported
    graph took of an input the CPU ignores, such as the attention splits); returns how many."""
    count = 0
    for node in reversed(list(graph.nodes)):
        if is_free(node) and not node.users:
            graph.erase_node(node)
            count += 1
    return count


def _fixed_value(node: torch.fx.Node, real: dict) -> torch.Tensor | None:
    """The tensor an input (or a view chain from one) is every call, or None."""
    if node.op == "placeholder":
        return real[node.name]
    if node.op == "call_function" and is_free(node) and isinstance(node.args[0], torch.fx.Node):
        source = _fixed_value(node.args[0], real)
        if source is None:
            return None
        arguments = torch.fx.node.map_arg(node.args[1:], lambda a: _fixed_value(a, real))
        value = node.target(source, *arguments, **node.kwargs)
        return value if isinstance(value, torch.Tensor) else None
    return None


def _fake_values(graph: torch.fx.Graph, real: dict, placeholders: list) -> dict:
    """Every node's value as a static fake tensor: inputs from the real tensors, compiled and free
    calls run on fakes, an opaque call's result from its recorded shape (its symbols bound by the
    inputs' sizes); None where unknown (plans, calls without a result)."""
    binding = _binding(placeholders, real)
    mode = FakeTensorMode()
    values: dict[torch.fx.Node, object] = {}
    with mode:
        for node in graph.nodes:
            if node.op == "placeholder":
                values[node] = mode.from_tensor(real[node.name])
            elif node.op == "output":
                continue
            elif is_compiled(node) or is_free(node):
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: values.get(a))
                try:
                    values[node] = node.target(*args, **kwargs)
                except Exception:
                    values[node] = None
            else:
                values[node] = tree_map(lambda v: _concrete(v, binding), node.meta.get("val"))
    return values


def _binding(placeholders: list, real: dict) -> dict:
    """Symbols of the recorded input shapes -> the real tensors' sizes."""
    binding = {}
    for node in placeholders:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for size, actual in zip(value.shape, real[node.name].shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                binding[size.node.expr] = actual
    return binding


def _concrete(value, binding: dict):
    if not isinstance(value, torch.Tensor):
        return None
    shape = []
    for size in value.shape:
        if isinstance(size, torch.SymInt):
            size = sympy.sympify(sympy.sympify(size.node.expr).xreplace(binding))
            if not size.is_Integer:
                return None
        shape.append(int(size))
    return torch.empty(shape, dtype=value.dtype)

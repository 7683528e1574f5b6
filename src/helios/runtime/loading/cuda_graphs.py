"""CUDA graphs captured at load: one per selected program, replayed on fixed argument buffers.

Every program of a `LoadedModel` is called with the same arguments each step: its weight list and
its input buffers narrowed to the program's static extents (`program_arguments`). Those tensors
never move, so a program can be captured once at load and replayed while serving: a replay
launches the recorded kernels on the recorded addresses and allocates nothing.

Capture order and memory: programs are warmed up (Triton compiles its kernels here, not while
serving; with a `KernelCompiler`, a dry run of every graph first has its worker processes compile
them side by side, `helios.runtime.loading.kernel_precompile`), then captured largest first into one
shared memory pool. Graphs that share a pool may
reuse each other's intermediate memory, which is safe because one model worker replays one graph
at a time on one stream and reads a graph's outputs (the completion record, logits) before the
next replay. Warm-up and capture run the programs on all-zero inputs, which can write cache pages
and state rows; `capture_programs` zeroes every non-weight buffer afterwards, so serving starts
from the state `load_model` allocated.

The captured callable ignores the arguments it is given: the executor passes the same buffers the
graph recorded, and `CapturedProgram.check_arguments` (used by tests) proves it.

Each program is captured twice: as exported, and as its greedy variant (`greedy_module`: a copy of
its graph whose ``helios::sample`` calls are bound to `helios.abi.sampling.SampleVariant.GREEDY`,
which leaves the random draws out - the per-row sort and prefix sums over the whole vocabulary,
most of a large batch's sampling time). The choice is made here, explicitly, per captured graph;
no thread or global mode is involved. `GraphExecutor` replays the greedy graph only for steps in
which no row samples with temperature > 0; there both graphs select the same tokens. A
token-logprobs variant (replayed only for steps holding a request that asks for log-probabilities)
gets no greedy graph: its greedy steps replay the full graph, the same tokens, and load captures
one graph fewer (a greedy copy, a warm-up run and a capture) per such variant.

A long prompt program (`helios.runtime.loading.fresh_calls.wants_fresh_graph`) is also captured as
its fresh-chunk variant (`fresh_module`: each layer's rotary cache write and attention as one
``helios::rotary_fresh_attention`` call, the causal attention over the layer's fresh keys and values
by a fused kernel), full and greedy: `GraphExecutor` replays those only for steps that hold one
prompt chunk starting at position 0 (`helios.runtime.execution.program_variants.is_fresh_chunk`),
where they compute the program's result. A fresh variant that cannot be captured is left out with a
warning (the program's own graphs serve every step); one that runs out of device memory is a
`CaptureMemoryError`, as the program's own graphs would be (fewer pages make room for it).

Both graphs are captured from `helios.runtime.loading.gemv_calls.gemv_module` of the program: its
projections whose shapes the committed tables (`helios.abi.gemv_tiles`) name run a Triton kernel
instead of cuBLAS (one row: the matrix-vector kernel; more: the skinny matrix product; the same
product, chosen here, per captured program, from static shapes), and,
where `helios.runtime.loading.rotary_calls.FUSE_AT_CAPTURE` enables it (on by default), each layer's
rotary cache write and attention run as one ``helios::rotary_paged_attention`` call (one kernel
launch per layer on a decode step instead of two). Last, each graph's per-step bookkeeping (step
geometry, sampling epilogue) is collapsed into fewer launches by
`helios.runtime.loading.step_calls.step_module` (repeated calls merged, shape-only tensors made once,
integer accumulations in one launch; the same values), and, where
`helios.runtime.loading.elementwise_runs.FUSE_RUNS` enables it (off until measured), runs of small
integer elementwise calls become one generated kernel each.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from typing import Iterable, Mapping, Sequence

import torch

from helios.abi.sampling import SampleVariant, bind_sample_variant
from helios.errors import LoadError
from helios.runtime.loading.cpu_programs import CpuProgram
from helios.runtime.loading.elementwise_runs import runs_module
from helios.runtime.loading.fresh_calls import fresh_module, wants_fresh_graph
from helios.runtime.loading.gemm_algos import choose_algorithms, lt_shapes
from helios.runtime.loading.gemv_calls import gemv_module
from helios.runtime.loading.kernel_precompile import KernelCompiler
from helios.runtime.loading.memory_budget import InsufficientMemoryError
from helios.runtime.loading.program_build import deferred_recompile, finish_recompile
from helios.runtime.loading.rotary_calls import rotary_module
from helios.runtime.loading.sampling_rewrite import bind_greedy_rows
from helios.runtime.loading.step_calls import step_module


_LOG = logging.getLogger(__name__)


class CaptureError(LoadError):
    """A program could not be captured into a CUDA graph (it synchronises or allocates host data)."""


class CaptureMemoryError(InsufficientMemoryError):
    """The device ran out of memory while a program was warmed up or captured (the pages took too much)."""


class CapturedProgram:
    """A program's CUDA graphs (full and greedy-only) and their static outputs; `fresh`, when the
    program has them, its fresh-chunk variant's graphs (a `CapturedProgram` of the same arguments)."""

    def __init__(self, full: tuple, greedy: tuple, arguments: Sequence[object], module=None, greedy_module=None,
                 fresh: CapturedProgram | None = None):
        self._modules = (module, greedy_module)  # own any constants the graphs read: they must outlive them
        self._full = full  # (graph, outputs)
        self._greedy = greedy
        self._fresh = fresh
        self._pointers = _pointers(arguments)

    def __call__(self, *arguments):
        return self.replay(greedy=False)

    def replay(self, greedy: bool, fresh: bool = False):
        """Replays the greedy-only graph when `greedy` (no row of the step draws) and the program has
        one, else the full one; of the fresh-chunk variant when `fresh` (the step holds one prompt
        chunk starting at position 0) and the program has one. The outputs are the same tensors for
        every graph only where the caller reads them before the next replay of another graph."""
        if self._full is None:
            raise CaptureError("the program's CUDA graphs were released (the model is shutting down)")
        if fresh and self._fresh is not None:
            return self._fresh.replay(greedy)
        graph, outputs = self._greedy if greedy and self._greedy is not None else self._full
        graph.replay()
        return outputs

    def release(self) -> None:
        """Destroys every graph (a graph still running is freed when it finishes). Idempotent.

        A graph holding NCCL collectives keeps their communicator's resources: tearing the
        communicator down waits until every such graph is gone, so a tensor-parallel rank
        releases its graphs before it aborts its device group."""
        for pair in (self._full, self._greedy):
            if pair is not None:
                pair[0].reset()
        if self._fresh is not None:
            self._fresh.release()
        self._full = self._greedy = self._fresh = None

    @property
    def has_greedy_graph(self) -> bool:
        return self._greedy is not None

    @property
    def has_fresh_graph(self) -> bool:
        return self._fresh is not None

    @property
    def eager_modules(self) -> tuple:
        """(full, greedy): the eager modules the two graphs were captured from."""
        return self._modules

    def check_arguments(self, arguments: Sequence[object]) -> bool:
        """Whether `arguments` are the tensors (same addresses and shapes) the graph recorded."""
        return _pointers(arguments) == self._pointers


def release_graphs(programs: Iterable) -> None:
    """Releases the CUDA graphs of every captured program among `programs` (LoadedProgram)."""
    for program in programs:
        if isinstance(program.module, CapturedProgram):
            program.module.release()


def capture_programs(programs: Sequence, arguments_of, buffers: Mapping[str, torch.Tensor],
                     device: torch.device, warmups: int = 1, keep: Iterable[str] = (),
                     compiler: KernelCompiler | None = None, plans: "CapturePlans | None" = None) -> tuple:
    """`programs` (LoadedProgram) with each `module` replaced by its `CapturedProgram`.

    `arguments_of(program)` returns the program's fixed argument list. One warm-up call per graph
    (Triton compiles, cuBLAS initialises) before it is recorded: a second one found nothing left to
    initialise and cost a full program run per graph at load. Buffers named in `keep`
    (startup tuning outputs, which serving programs only read) are not zeroed after warm-up.
    With `compiler` (active), every graph is first dry-run so that the Triton kernels the warm-up
    runs would compile one after another compile side by side in its workers
    (`helios.runtime.loading.kernel_precompile`). `plans`: the programs' graph modules built
    beforehand (`plan_captures`, while the weights load); a program it lacks is planned here.
    Raises `CaptureError` naming the program when warm-up or capture fails, `CaptureMemoryError` (an
    `InsufficientMemoryError`) when it runs out of device memory.
    """
    pool = torch.cuda.graph_pool_handle()
    ordered = sorted(programs, key=lambda p: (p.packed_token_capacity, p.batch_capacity), reverse=True)
    captured = {}
    built = plans if plans is not None else CapturePlans({})
    with torch.inference_mode(), torch.cuda.device(device):
        try:
            plans = [built.take(program, device, arguments_of(program)) for program in ordered]
            choose_algorithms(lt_shapes(module for plan in plans for module in plan.modules()), device)
            if compiler is not None and compiler.active:
                _precompile(plans, compiler, buffers)
            for plan in plans:
                captured[id(plan.program)] = _capture(plan, pool, warmups)
        except BaseException:
            for done in captured.values():  # before a caller tears down NCCL (see `release`)
                done.release()
            raise
        torch.cuda.synchronize(device)
        kept = set(keep)
        for name, tensor in buffers.items():
            if tensor.device.type == "cuda" and name not in kept:
                tensor.zero_()
        torch.cuda.synchronize(device)
    return tuple(dataclasses.replace(p, module=captured[id(p)]) for p in programs)


@dataclasses.dataclass
class _Plan:
    """A program's graphs to capture: its (full, greedy or None) modules and, where it has one and it
    could be built, its fresh-chunk variant's; `arguments` set once the weights and buffers exist."""

    program: object
    name: str
    main: tuple
    fresh: tuple | None
    arguments: list | None = None

    def modules(self) -> list:
        """The graph modules to capture (full, greedy, fresh variants; None left out)."""
        return [m for m in (*self.main, *(self.fresh or ())) if m is not None]


@dataclasses.dataclass
class CapturePlans:
    """Graph modules built for `capture_programs` ahead of it (`plan_captures`), by program identity."""

    plans: dict

    def take(self, program, device: torch.device, arguments: list) -> _Plan:
        """The program's plan (built now if it was not built ahead) with its arguments."""
        plan = self.plans.pop(id(program), None) or _plan(program, device)
        plan.arguments = arguments
        return plan

    def modules(self) -> list:
        """Every planned graph module (what `choose_gemm_algorithms` reads the projections of)."""
        return [module for plan in self.plans.values() for module in plan.modules()]


def choose_gemm_algorithms(plans: CapturePlans, device: torch.device) -> None:
    """Times and registers cuBLASLt's algorithm for every projection shape the planned graphs bound
    to it (`helios.runtime.loading.gemm_algos`), then returns the timing's memory to the device:
    called before the cache pages are sized from the free memory."""
    if device.type != "cuda":
        return
    shapes = lt_shapes(plans.modules())
    if shapes:
        choose_algorithms(shapes, device)
        torch.cuda.empty_cache()


def plan_captures(programs: Sequence, device: torch.device, ahead=None) -> CapturePlans:
    """Every program's graph modules as `capture_programs` captures them, built before its weights and
    buffers exist (only the programs' graphs are read): `load_model` builds them while the weights
    load. A program whose modules cannot be built is left out here; `capture_programs` plans it
    again and reports the error. Built as `capture_programs` builds them: in inference mode, with
    `device` current (a rank's constants land on its own device). `ahead`: called with each plan once
    it is built (`helios.runtime.loading.dry_run_ahead.DryRunAhead`: the precompile's dry run)."""
    plans = {}
    current = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with torch.inference_mode(), current:
        for program in programs:
            try:
                plan = plans[id(program)] = _plan(program, device)
            except CaptureError:
                continue
            if ahead is not None:
                ahead(plan)
    return CapturePlans(plans)


def _plan(program, device: torch.device | None) -> _Plan:
    """The program's graph modules to capture. The rewrites between the program's module and each
    captured one build several GraphModules (the rotary fusion, each variant's copy, the step
    bookkeeping); only the captured ones are ever called, so their code is generated once each at
    the end (`deferred_recompile`), not by every rewrite (about two thirds of this work). The
    program's graph is copied once per captured graph (by its first rewrite that changes it, or its
    variant's binding); every later rewrite is given that copy and changes it in place. The program's
    own module is never changed (both variants and later loads read it)."""
    name = f"{program.graph} (batch {program.batch_capacity}, {program.packed_token_capacity} tokens)"
    with deferred_recompile():
        # rotary + attention pairs: one op (if on); projections the tables name: the Triton kernels
        fused = rotary_module(program.module)
        module = gemv_module(fused, in_place=fused is not program.module)
        fresh = None  # derived before `module`'s own graph is rewritten in place (where it is a copy)
        fresh_variant = fresh_module(module) if wants_fresh_graph(program) else None
        if fresh_variant is not None:
            try:
                fresh = _graph_variants(fresh_variant, program, device, owned=True)
            except RuntimeError as error:
                _fresh_left_out(name, error)
        try:
            main = _graph_variants(module, program, device, owned=module is not program.module)
        except RuntimeError as error:
            raise CaptureError(f"program {name} cannot be captured into a CUDA graph: {error}") from error
    for built in (*main, *(fresh or ())):
        if built is not None:
            finish_recompile(built)
    return _Plan(program, name, main, fresh)


def _graph_variants(module, program, device, owned: bool) -> tuple:
    """`module`'s full graph module and, where the program wants one, its greedy graph module; each with
    its per-step bookkeeping in fewer launches (`step_calls`, then `elementwise_runs`, last). `owned`:
    `module` is a copy made for this capture, so the full graph's rewrites change it in place (after
    the greedy copy is made of it) instead of copying its graph once more; the greedy copy is always
    rewritten in place."""
    greedy = None
    if wants_greedy_graph(program):
        bound = greedy_module(module)
        greedy = _bookkeeping(bound, device, owned=bound is not module)
    full = _bookkeeping(module, device, owned)
    return full, greedy


def _bookkeeping(module, device, owned: bool):
    """`step_module`, then `runs_module`, of `module`: in place where `owned` (a copy made for this
    capture), and the runs in place on the copy the step rewrite made, if it made one."""
    stepped = step_module(module, device, in_place=owned)
    return runs_module(stepped, in_place=owned or stepped is not module)


def _fresh_left_out(name: str, error: BaseException) -> None:
    _LOG.warning("program %s: its fresh-chunk variant cannot be captured (%s); cold prompts run the paged "
                 "attention", name, error)


def _precompile(plans: Sequence[_Plan], compiler: KernelCompiler, buffers: Mapping[str, torch.Tensor]) -> None:
    """Every plan's graphs dry-run on a side stream (`KernelCompiler.dry_run`) unless
    that was done ahead on stand-ins (`KernelCompiler.ran_ahead`), then the workers' compiles awaited.
    A graph that fails here is left to its warm-up run, which reports the error."""
    started = time.perf_counter()
    if not compiler.ran_ahead:
        arguments = [*buffers.values()]
        for plan in plans:
            for argument in plan.arguments:
                arguments.extend(argument if isinstance(argument, (list, tuple)) else (argument,))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with compiler.dry_run(arguments), torch.cuda.stream(stream):
            for plan in plans:
                dry_run_plan(plan, plan.arguments, compiler)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.current_stream().synchronize()
    dry = time.perf_counter() - started
    report = compiler.wait()
    where = (f"a {compiler.ahead_seconds:.1f} s dry run on stand-ins while the weights loaded, then "
             f"{time.perf_counter() - started:.1f} s at capture") if compiler.ran_ahead else \
        f"a {dry:.1f} s dry run and {time.perf_counter() - started - dry:.1f} s after it"
    _LOG.info("Triton kernels: %d variants compiled by %d workers (%.1f s of compiling) during %s",
              report["variants"], compiler.workers, report["seconds"], where)
    for kernel, label, sent, took, finished in sorted(report["compiles"], key=lambda c: -c[4])[:DRY_RUN_REPORT]:
        _LOG.info("  %s: sent %.1f s after the first (%s), compiled in %.1f s, done at %.1f s", kernel, sent,
                  label, took, finished)


DRY_RUN_REPORT = 6  # the variants whose compiles finished last, logged (INFO) after each precompile


def dry_run_plan(plan: _Plan, arguments: list, compiler: KernelCompiler) -> None:
    """Calls each of `plan`'s graph modules on `arguments` (inside `compiler.dry_run`, which the caller
    enters); a module that fails is left to its warm-up run, which raises its error, typed."""
    compiler.label = plan.name
    for module in (*plan.main, *(plan.fresh or ())):
        if module is None:
            continue
        compiler.protect(held_tensors(module))  # its constants outlive the dry run: never zeroed by it
        try:
            module(*arguments)
        except Exception as error:  # noqa: BLE001 - its warm-up run raises it, typed
            _LOG.debug("dry run of %s failed: %s", plan.name, error)


def held_tensors(module) -> list[torch.Tensor]:
    """The tensors `module` holds itself (every call reads the same ones): its parameters and buffers,
    and the tensor attributes its graph reads (``get_attr``); none for a plain callable."""
    if not isinstance(module, torch.nn.Module):
        return []
    held = [*module.parameters(), *module.buffers()]
    for node in module.graph.nodes if isinstance(module, torch.fx.GraphModule) else ():
        if node.op == "get_attr":
            value = module
            for part in node.target.split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor):
                held.append(value)
    return held


def _capture(plan: _Plan, pool, warmups: int) -> CapturedProgram:
    try:
        captured = _capture_module(plan.main, plan.arguments, pool, warmups)
    except torch.OutOfMemoryError as error:
        raise _out_of_memory(f"program {plan.name}") from error
    except RuntimeError as error:
        raise CaptureError(f"program {plan.name} cannot be captured into a CUDA graph: {error}") from error
    if plan.fresh is not None:
        try:
            captured._fresh = _capture_module(plan.fresh, plan.arguments, pool, 1)
        except torch.OutOfMemoryError as error:  # not left out: fewer pages make room for it
            captured.release()  # the traceback would keep its graphs (and any NCCL work they hold) alive
            raise _out_of_memory(f"program {plan.name}'s fresh-chunk variant") from error
        except RuntimeError as error:  # the program's own graphs serve every step
            _fresh_left_out(plan.name, error)
    return captured


def _out_of_memory(what: str) -> CaptureMemoryError:
    return CaptureMemoryError(f"{what} ran out of device memory in its CUDA graph capture: fewer cache pages leave "
                              "it room (--memory-fraction F below the default, or --pages N)")


def _capture_module(variants: tuple, arguments: list, pool, warmups: int) -> CapturedProgram:
    """The (full, greedy or None) graph modules recorded: the full one after `warmups` warm-up runs,
    the greedy one after one."""
    full_variant, greedy_variant = variants
    full = greedy = None
    try:
        full = _record(full_variant, arguments, pool, warmups)
        if greedy_variant is not None:
            greedy = _record(greedy_variant, arguments, pool, 1)
    except BaseException:
        if full is not None:  # the traceback would keep it (and any NCCL work it holds) alive
            full[0].reset()
        raise
    return CapturedProgram(full, greedy, arguments, full_variant, greedy_variant)


def wants_greedy_graph(program) -> bool:
    """Whether `program` (LoadedProgram) gets a greedy graph: every program but a token-logprobs
    variant (see the module docstring)."""
    return not program.token_logprobs


def greedy_module(module):
    """`variant_module(module, SampleVariant.GREEDY)` with its sampling calls reading counts through
    the slots (`helios.runtime.loading.sampling_rewrite`): the module of a program's greedy graph."""
    bound = variant_module(module, SampleVariant.GREEDY)
    if bound is not module and isinstance(bound, torch.fx.GraphModule) and bind_greedy_rows(bound.graph):
        bound.recompile()
    return bound


def variant_module(module, variant: SampleVariant):
    """A module computing `module`'s program with ``helios::sample`` bound to `variant` (a new
    graph sharing `module`'s attributes; `module` is not changed). A module whose graph samples
    nothing is returned as it is."""
    if isinstance(module, torch.fx.GraphModule):
        graph = copy.deepcopy(module.graph)
        if not bind_sample_variant(graph, variant):
            return module
        return torch.fx.GraphModule(module, graph)
    if isinstance(module, CpuProgram):
        bound = copy.copy(module)
        bound.module = variant_module(module.module, variant)
        bound.recompile()
        return bound
    raise CaptureError(f"a {type(module).__name__} has no graph to bind a sampling variant into")


def _record(module, arguments: list, pool, warmups: int) -> tuple:
    """Warm-up calls on a side stream, then one call captured: (graph, its static outputs).
    (`torch.cuda.graph` empties the allocator's cache before it captures, so the blocks the warm-up
    freed serve the capture's own pool.)"""
    _warm_up(module, arguments, warmups)
    return _record_graph(module, arguments, pool)


def _warm_up(module, arguments: list, warmups: int) -> None:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            module(*arguments)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.current_stream().synchronize()  # so a load profile charges the runs here, not the capture


def _record_graph(module, arguments: list, pool) -> tuple:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = module(*arguments)
    return graph, outputs


def _pointers(arguments: Sequence[object]) -> tuple:
    flat = []
    for argument in arguments:
        for tensor in argument if isinstance(argument, (list, tuple)) else (argument,):
            flat.append((tensor.data_ptr(), tuple(tensor.shape), tensor.dtype))
    return tuple(flat)

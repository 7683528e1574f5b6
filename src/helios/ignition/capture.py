"""Capture: export the generic programs of an Architecture with torch.export at capacity variants.

Each (operation, capacity) becomes one `CapturedProgram`: its program image
(`helios.abi.program_image`: the graph's JSON and its tensors, nothing pickled) plus its `ProgramSpec`. Programs are captured on the CPU from example tensors that carry no data
(``torch.empty``; tracing never reads them), with weights lifted to the first input, so the saved
bytes hold neither weights nor example data. R and T are static; the page count, request-slot counts
and page-table width are symbolic, so physical cache capacities can be chosen after loading.

`load_program` unpickles nothing and checks the graph first (`helios.abi.program_graph`), but the
runtime still reads programs only from verified, authorized cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.fx.config
from torch.export import Dim

from helios.abi.program_image import decode_program, encode_program
from helios.abi.registry import program_ops
from helios.ignition.architecture import Architecture
from helios.ignition.hybrid_program import build_hybrid_program
from helios.ignition.program import (
    DecodeProgram, GenerationProgram, MixedProgram, ScoredPrefillProgram, TunedDecodeProgram,
)
from helios.ignition.program_spec import (
    Capacity, Operation, ProgramOptions, ProgramSpec, TensorSpec, canonical_input_names, program_spec,
)
from helios.ignition.speculative import SpeculativeProgram
from helios.ignition.tuning import AttentionTuningProgram

_TORCH_DTYPES = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}
# Example extents of the symbolic dims (>= 2, so tracing does not specialise them; any extent >= 1 runs).
_EXAMPLE_EXTENTS = {"pages": 3, "slots": 2, "request_rows": 4, "max_pages": 2, "window_pages": 5}


@dataclass(frozen=True)
class CapturedProgram:
    """One exported program (program image bytes, no weights, no example inputs) and its spec."""

    spec: ProgramSpec
    program: bytes
    seconds: float = 0.0  # wall time of the export and encoding (progress reports; not stored in the core)


def build_program(arch: Architecture, operation: Operation, page_tokens: int,
                  options: ProgramOptions = ProgramOptions(), capacity: Capacity | None = None) -> torch.nn.Module:
    """The eager module of `operation` (also usable directly, e.g. for debugging); SPECULATIVE
    and tuned DECODE modules are built for one `capacity`."""
    if operation is Operation.TUNING:
        return AttentionTuningProgram(arch, options.attention_tuning)
    if options.multimodal is not None:
        from helios.ignition.multimodal_programs import build_multimodal

        return build_multimodal(arch, operation, page_tokens, options, capacity)
    if arch.recurrent is not None:
        return build_hybrid_program(arch, operation, page_tokens, options, capacity)
    if operation is Operation.DECODE and options.attention_tuning is not None:
        if capacity is None:
            raise ValueError("a tuned DECODE program is built for one capacity")
        return TunedDecodeProgram(arch, page_tokens, options, capacity.batch_capacity)
    if operation is Operation.SPECULATIVE:
        if capacity is None:
            raise ValueError("a SPECULATIVE program is built for one capacity")
        return SpeculativeProgram(arch, page_tokens, capacity, options)
    if operation is Operation.SCORED_PREFILL:
        return ScoredPrefillProgram(arch, page_tokens, options)
    if operation is Operation.MIXED:
        return MixedProgram(arch, page_tokens, options)
    if operation is Operation.DECODE:
        return DecodeProgram(arch, page_tokens, options)
    return GenerationProgram(arch, page_tokens, options)


def capture_program(arch: Architecture, operation: Operation, capacity: Capacity, page_tokens: int,
                    options: ProgramOptions = ProgramOptions()) -> CapturedProgram:
    """Export one program and store it as a program image; its spec lists the ABI ops the graph
    calls, with their schemas."""
    started = time.perf_counter()
    spec, exported = export_program(arch, operation, capacity, page_tokens, options)
    return CapturedProgram(spec, encode_program(exported), time.perf_counter() - started)


def export_program(arch: Architecture, operation: Operation, capacity: Capacity, page_tokens: int,
                   options: ProgramOptions = ProgramOptions()) -> tuple[ProgramSpec, torch.export.ExportedProgram]:
    """The ExportedProgram of one (operation, capacity) (no example inputs) and its spec."""
    spec = program_spec(arch, operation, capacity, page_tokens, options)
    module = build_program(arch, operation, page_tokens, options, capacity)
    parameters = parameter_names(module)
    if parameters != canonical_input_names(spec.input_names):
        raise AssertionError(f"program signature {parameters} disagrees with its spec {spec.input_names}")
    args, dynamic_shapes = _example_inputs(spec)
    dynamic_shapes = _grouped_varargs(module, dynamic_shapes)
    with _STACK_TRACES.off():
        exported = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    if operation is Operation.TUNING:
        # A producer returns nothing; functionalizing records its in-place write as the graph's
        # (input mutation) output, which saving needs and loading applies back to the buffer.
        with warnings.catch_warnings():  # torch's own pytree deprecation notice while copying the graph
            warnings.simplefilter("ignore", FutureWarning)
            exported = exported.run_decompositions({})
    exported.example_inputs = None  # never ship example data
    return dataclasses.replace(spec, abi_ops=tuple(sorted(program_ops(exported).items()))), exported


class _StackTraces:
    """Tracing without each graph node's Python stack trace: `encode_program` drops node metadata, so
    the traces only cost time (about 15% of a tiny core's preparation; the images are the same bytes).
    torch 2.13 has the switch (`torch.fx.config.do_not_emit_stack_traces`); torch 2.11 traces as before.
    The switch is process-wide: set while any export of this module runs here, then restored."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exports = 0
        self._before = False

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        if not hasattr(torch.fx.config, "do_not_emit_stack_traces"):
            yield
            return
        with self._lock:
            if self._exports == 0:
                self._before = torch.fx.config.do_not_emit_stack_traces
                torch.fx.config.do_not_emit_stack_traces = True
            self._exports += 1
        try:
            yield
        finally:
            with self._lock:
                self._exports -= 1
                if self._exports == 0:
                    torch.fx.config.do_not_emit_stack_traces = self._before


_STACK_TRACES = _StackTraces()


def parameter_names(module: torch.nn.Module) -> tuple[str, ...]:
    """The names a module's forward takes, its ``*trailing`` inputs expanded to `trailing_input_names`."""
    names = []
    for name, parameter in inspect.signature(module.forward).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            names += getattr(module, "trailing_input_names", ())
        else:
            names.append(name)
    return tuple(names)


def _grouped_varargs(module: torch.nn.Module, shapes: tuple) -> tuple:
    """torch.export wants the shapes of ``*trailing`` inputs as one nested entry."""
    extra = len(getattr(module, "trailing_input_names", ()))
    has_varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL
                      for p in inspect.signature(module.forward).parameters.values())
    if not has_varargs or not extra:
        return shapes
    return shapes[:len(shapes) - extra] + (shapes[len(shapes) - extra:],)


def capture_programs(
    arch: Architecture, variants: Iterable[tuple[Operation, Capacity]], page_tokens: int
) -> tuple[CapturedProgram, ...]:
    return tuple(capture_program(arch, operation, capacity, page_tokens) for operation, capacity in variants)


def load_program(program: bytes) -> torch.nn.Module:
    """Decode program image bytes into a callable module (no unpickling; the graph is checked first)."""
    return decode_program(program).module()


def _example_inputs(spec: ProgramSpec):
    """Uninitialised example tensors for `spec` and the torch.export dynamic-shape description."""
    dims = {name: Dim(name, min=1) for name in _EXAMPLE_EXTENTS}
    weights = [torch.empty(slot.shape, dtype=_TORCH_DTYPES[slot.dtype]) for slot in spec.weights]
    args, shapes = [weights], [[None] * len(weights)]
    for tensor_spec in spec.inputs[1:]:
        args.append(_example_tensor(tensor_spec))
        symbolic = {axis: dims[dim] for axis, dim in enumerate(tensor_spec.shape) if isinstance(dim, str)}
        shapes.append(symbolic or None)
    return tuple(args), tuple(shapes)


def _example_tensor(spec: TensorSpec) -> torch.Tensor:
    shape = tuple(_EXAMPLE_EXTENTS[dim] if isinstance(dim, str) else dim for dim in spec.shape)
    return torch.zeros(shape, dtype=_TORCH_DTYPES[spec.dtype])

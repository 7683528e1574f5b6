"""Calling an Inductor-compiled segment without AOT Autograd's runtime wrappers.

`torch._inductor.compile` runs a graph through AOT Autograd, and every call of what it returns
goes through AOT's runtime wrappers (grad mode, input mutations, outputs aliasing inputs, dynamo's
disabled frame) before the generated code's `call`: on the CPU that costs more than a small fused
kernel (measured: 17-22 us a call against 6-7 us for `call` itself). A compiled segment
(`helios.runtime.loading.program_compile`) is pure (it mutates no input) and runs inside
`torch.inference_mode()`, so for most segments the wrappers do nothing.

`compile_segment` compiles through the same `compile_fx` entry point, keeps the inner compiled graph
(`compile_fx_inner`'s output) and calls the generated code directly when that is provably the same
call: exactly one inner graph was compiled, it mutates no input and checks no input's alignment,
and on the segment's example inputs it returns as many outputs as the wrapped call, each of the
same dtype, shape, strides, values and aliasing (a view of the same input, or of none).
Otherwise (AOT regenerated an output it stripped, added a mutation, or torch's internals differ)
the wrapped call is used, as before.

The generated code checks no input's sizes and strides (Inductor's `size_asserts` off, for these
compiles only): a segment is called only by its program's fast graph, with the program's static
buffers and the outputs of calls whose shapes the same static shapes fix, so each check (about half
a microsecond, some 70 a decode step of the embedded model) could never fail; a decode step at
batch 16 took 0.97x the time without them (same process, interleaved). `segment.source_code` holds
the generated code (None where Inductor keeps none).

Thread ownership: called at load; the returned calls run on the model worker.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def compile_segment(module: torch.fx.GraphModule, examples: Sequence[torch.Tensor], name: str) -> tuple[Callable, bool]:
    """(the segment's call, named `name`, taking its tensors as positional arguments; whether it
    calls the generated code directly)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    captured = []

    def inner_compile(*args, **kwargs):
        compiled_graph = compile_fx_inner(*args, **kwargs)
        captured.append(compiled_graph)
        return compiled_graph

    from torch._inductor import config

    with config.patch(size_asserts=False):
        wrapped = compile_fx(module, list(examples), inner_compile=inner_compile)
    direct = _direct_call(captured, wrapped, examples)
    if direct is None:
        def segment(*arguments):
            return wrapped(*arguments)
    else:
        def segment(*arguments):
            return direct(list(arguments))  # the generated call consumes (clears) its list
    segment.__name__ = segment.__qualname__ = name
    segment.source_code = getattr(captured[0], "source_code", None) if len(captured) == 1 else None
    return segment, direct is not None


def _direct_call(captured: list, wrapped: Callable, examples: Sequence[torch.Tensor]) -> Callable | None:
    """The inner graph's generated `call` (taking a list it consumes) when it is the wrapped
    call's equal (see the module docstring), else None."""
    if len(captured) != 1:
        return None
    graph = captured[0]
    call = getattr(graph, "current_callable", None)
    if call is None or getattr(graph, "mutated_inputs", True) or getattr(graph, "inputs_to_check", True):
        return None
    with torch.inference_mode():
        expected = wrapped(*examples)
        got = call(list(examples))
    return call if _same_outputs(expected, got, examples) else None


def _same_outputs(expected, got, inputs: Sequence[torch.Tensor]) -> bool:
    """Same count, and each output of the same dtype, shape, strides, values and aliasing (the
    input whose memory it views, if any, at the same offset)."""
    if not isinstance(expected, (tuple, list)) or not isinstance(got, (tuple, list)) or len(expected) != len(got):
        return False
    memory = {tensor.untyped_storage().data_ptr(): index for index, tensor in enumerate(inputs)}
    for a, b in zip(expected, got):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride() or a.device != b.device:
            return False
        aliased = (memory.get(a.untyped_storage().data_ptr()), memory.get(b.untyped_storage().data_ptr()))
        if aliased[0] != aliased[1] or (aliased[0] is not None and a.storage_offset() != b.storage_offset()):
            return False
        if not torch.equal(a, b):
            return False
    return True

"""Calling ops on CUDA in GPU tests: inputs to the device, a call that must not synchronise, and a
call captured into a CUDA graph."""

from __future__ import annotations

import contextlib

import torch


def to_cuda(inputs: dict) -> dict:
    """The tensors of `inputs` on the current CUDA device; other values as they are."""
    return {name: v.to("cuda") if isinstance(v, torch.Tensor) else v for name, v in inputs.items()}


@contextlib.contextmanager
def sync_errors():
    """Any synchronising CUDA call inside the block raises (restored to "default" afterwards)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def without_sync(call):
    """`call()` once to warm up (compilation, autotuning, lazy init), then again under sync errors."""
    call()
    with sync_errors():
        result = call()
    torch.cuda.synchronize()
    return result


def capture(call):
    """(graph, static outputs) of `call` captured after a warm-up on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call()
    return graph, outputs

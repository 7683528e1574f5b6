"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (CUDA, compute
capability 9.0 and later).

In a stream (and in a CUDA graph captured from one) a kernel normally starts only after the
previous kernel has finished and its writes are flushed, so the tail of each kernel (its last
wave draining, a few SMs busy) and the head of the next (programs being placed, their first
loads in flight) do not overlap. A kernel launched with PDL may start while the previous one is
still running, once that kernel has let it (``griddepcontrol.launch_dependents``, or its exit);
it must then wait (``griddepcontrol.wait``: the previous kernel complete, its writes visible)
before it reads anything the previous kernel may write, or writes anything it may read. The
kernels that take it (`helios.abi.triton_fused._rms_norm_kernel`, `helios.abi.triton_skinny`'s
two) let the next kernel start first and wait before their first load of an activation; the
skinny kernels first ask L2 for the start of their weight rows, which no kernel writes. The
decode attention kernel (`helios.abi.triton_decode._decode_kernel`) waits first thing: its
launch and the placement of its programs overlap the qkv product's tail (0.4-1.3 us a call on an
H200, bench/decode_fixed_cost.py); it takes it for launches of at most 64 tokens
(`helios.abi.triton_decode.takes_dependent_launch`: at 256 rows the whole step lost 1% with it). The
results are the same bits (the same arithmetic in the same order; `bench/pdl_ab.py` and the GPU
tests compare them); a kernel after one of these that was not launched with PDL waits as before.

`ENABLED` turns it off for every later launch (graphs captured before keep what they captured).
"""

from __future__ import annotations

import torch

__all__ = ["ENABLED", "PREFETCH_COLUMNS", "dependent_launch"]

ENABLED = True
PREFETCH_COLUMNS = 256  # weight columns a skinny program asks L2 for before it waits (bench/pdl_ab.py)
_CAPABLE: dict[int, bool] = {}


def dependent_launch(tensor: torch.Tensor) -> bool:
    """Whether kernels launched for `tensor`'s device take PDL: `ENABLED`, a CUDA device of compute
    capability 9.0 or later (never under the Triton interpreter, whose tensors are on the CPU)."""
    if not ENABLED or not tensor.is_cuda:
        return False
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    capable = _CAPABLE.get(index)
    if capable is None:
        capable = _CAPABLE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return capable

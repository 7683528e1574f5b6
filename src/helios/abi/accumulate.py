"""Integer ``index_put_(indices, values, accumulate=True)`` as one Triton launch on CUDA
(`helios.abi.triton_accumulate`).

A program counts each sampled token (``output_counts.index_put_((slots, tokens), 1, accumulate=True)``)
and stores its pending token the same way (`helios.ignition.program`). torch's CUDA path for an
accumulating ``index_put_`` sorts the linear indices first (so that float sums come out in a fixed
order): a radix sort, index arithmetic and device-side bound checks, about ten launches per call,
tens of microseconds of a one-row decode step for two calls. For integer tensors the sum does not
depend on the order of its additions, so one program of atomic adds per block of indices writes
the same values bit for bit.

`accumulate_into` takes exactly the cases the kernel covers (an int32 or int64 CUDA tensor, as many
one-dimensional index tensors of one length as it has dimensions, values of that length or one
value) and hands every other call to ``index_put_`` itself, so a graph bound to it stays exact for
every input. Indices are read as ``index_put_`` reads them (a negative one counts from the end);
an index out of range adds nothing, where ``index_put_`` stops the device with an assertion.
"""

from __future__ import annotations

import torch

__all__ = ["accumulate_into", "covered"]

_DTYPES = (torch.int32, torch.int64)


def covered(target: torch.Tensor, indices, values: torch.Tensor) -> bool:
    """Whether the kernel computes this call (else `accumulate_into` runs ``index_put_``)."""
    if target.dtype not in _DTYPES or target.dim() not in (1, 2) or len(indices) != target.dim():
        return False
    if any(not isinstance(i, torch.Tensor) or i.dim() != 1 or i.dtype not in (torch.int32, torch.int64)
           or i.device != target.device for i in indices):
        return False
    count = indices[0].shape[0]
    return (all(i.shape[0] == count for i in indices) and values.dtype == target.dtype and values.dim() <= 1
            and values.numel() in (count, 1) and values.device == target.device)


def accumulate_into(target: torch.Tensor, indices, values: torch.Tensor) -> torch.Tensor:
    """``target.index_put_(indices, values, accumulate=True)``: one launch on CUDA where `covered`,
    ``index_put_`` otherwise. Writes `target` in place and returns it."""
    indices = list(indices)
    if target.device.type != "cuda" or not covered(target, indices, values):
        return target.index_put_(indices, values, accumulate=True)
    from helios.abi.triton_accumulate import launch  # imports triton: only where the kernel runs

    return launch(target, indices, values)

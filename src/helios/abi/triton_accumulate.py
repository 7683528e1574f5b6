"""Integer ``index_put_(indices, values, accumulate=True)`` as one Triton launch (CUDA; CPU under
TRITON_INTERPRET=1).

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
import triton
import triton.language as tl

from helios.abi.triton_paged import on_device

__all__ = ["accumulate_into", "covered"]

_BLOCK = 256
_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _accumulate_kernel(target_ptr, first_ptr, second_ptr, values_ptr, count, size0, size1, stride0, stride1,
                       values_stride, TWO: tl.constexpr, BLOCK: tl.constexpr):
    """target[first[i], second[i]] += values[i] (one index: target[first[i]]) for this program's
    BLOCK entries i < count, atomically; entries whose index lies outside the target add nothing."""
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = at < count
    first = tl.load(first_ptr + at, mask=live, other=0).to(tl.int64)
    first = tl.where(first < 0, first + size0, first)
    inside = live & (first >= 0) & (first < size0)
    offset = first * stride0
    if TWO:
        second = tl.load(second_ptr + at, mask=live, other=0).to(tl.int64)
        second = tl.where(second < 0, second + size1, second)
        inside = inside & (second >= 0) & (second < size1)
        offset += second * stride1
    values = tl.load(values_ptr + at.to(tl.int64) * values_stride, mask=live, other=0)
    tl.atomic_add(target_ptr + offset, values, mask=inside)


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
    return launch(target, indices, values)


def launch(target: torch.Tensor, indices: list, values: torch.Tensor) -> torch.Tensor:
    """The kernel on a `covered` call (any device the kernel runs on; CPU tensors under the
    interpreter). Nothing is allocated: a CUDA graph can hold it."""
    count = indices[0].shape[0]
    if count == 0:
        return target
    first = indices[0] if indices[0].stride(0) == 1 else indices[0].contiguous()
    second = indices[1] if len(indices) == 2 else first
    second = second if second.stride(0) == 1 else second.contiguous()
    size1, stride1 = (target.shape[1], target.stride(1)) if target.dim() == 2 else (1, 0)
    values_stride = values.stride(0) if values.dim() == 1 and values.numel() > 1 else 0
    with on_device(target):
        _accumulate_kernel[(triton.cdiv(count, _BLOCK),)](
            target, first, second, values, count, target.shape[0], size1, target.stride(0), stride1,
            values_stride, TWO=len(indices) == 2, BLOCK=_BLOCK)
    return target

"""The Triton kernel behind `helios.abi.accumulate.accumulate_into` (CUDA; CPU under TRITON_INTERPRET=1):
``target[first[i], second[i]] += values[i]`` by atomic integer adds, one program per block of indices.
Imported only where a call runs it (the wrapper's module imports no triton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from helios.abi.triton_paged import on_device

__all__ = ["launch"]

_BLOCK = 256


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

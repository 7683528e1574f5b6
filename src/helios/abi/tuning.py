"""Execution ABI: device facts for startup tuning producers (namespace ``helios``).

Importing this module registers one custom op with ``torch.library``:

``helios::device_multiprocessors(Tensor like) -> Tensor``
    int32 [1] on like's device: the CUDA multiprocessor count of that device, or on the CPU
    ``torch.get_num_threads()``. Only startup tuning producers call it; they run once, eagerly,
    before any CUDA graph is captured, so reading a device property on the host is fine here (the
    op is not capturable and never appears in a serving program).
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError

__all__ = ["DEVICE_MULTIPROCESSORS_SCHEMA", "device_multiprocessors"]

DEVICE_MULTIPROCESSORS_SCHEMA = "(Tensor like) -> Tensor"
_OP = "helios::device_multiprocessors"


def _check(like) -> None:
    if not isinstance(like, torch.Tensor):
        raise AbiArgumentError(f"{_OP}: like must be a Tensor, got {type(like).__name__}")


@abi_op(_OP, mutates_args=(), schema=DEVICE_MULTIPROCESSORS_SCHEMA)
def device_multiprocessors(like: torch.Tensor) -> torch.Tensor:
    _check(like)
    return torch.tensor([torch.get_num_threads()], dtype=torch.int32, device=like.device)


@device_multiprocessors.register_fake
def _device_multiprocessors_fake(like):
    _check(like)
    return torch.empty(1, dtype=torch.int32, device=like.device)


@device_multiprocessors.register_kernel("cuda")
def _device_multiprocessors_cuda(like):
    _check(like)
    count = torch.cuda.get_device_properties(like.device).multi_processor_count
    return torch.tensor([count], dtype=torch.int32, device=like.device)

"""One-shot all-reduce of small device tensors over symmetric memory (CUDA, torch's ``symm_mem``).

NCCL's all-reduce of a few kilobytes (a decode step's per-layer partial sums) is latency-bound: a
ring or tree of several hops. Within one host, GPUs can instead read each other's memory: every
rank writes its tensor into a buffer allocated in symmetric memory, one barrier, and every rank
sums all ranks' buffers itself (``torch.ops.symm_mem.one_shot_all_reduce_copy_out``, which also
copies the local input into the buffer inside the same kernel, and ends with a barrier, so the
buffer is free again when the kernel ends). torch's kernel adds the ranks' values in rank order on
every rank, so the results are identical on every rank, bit for bit, as ``helios::all_reduce``
promises. It runs on the caller's stream and can be captured into a CUDA graph.

`open_symmetric_reducer` sets it up for one rank group at load (a collective step: every rank of
the group calls it); `RankGroup` uses the reducer for device tensors that `fits` (float32 or
bfloat16, at most `max_bytes`, a multiple of 16 bytes) and NCCL for the rest. Whether every rank
could set it up is agreed by the caller (`helios.runtime.parallel.rank_rendezvous`), so all ranks take the
same path. Unavailable symmetric memory (another torch, no peer access, a CPU model) leaves NCCL.

Caveat: a rank that dies inside a symmetric all-reduce leaves its peers' kernels waiting at the
barrier, which aborting NCCL does not end (the step deadline still fails the model on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = (torch.float32, torch.bfloat16)  # what torch's one-shot kernel reduces
MAX_BYTES = 1 << 20  # a batch-64 decode step's bf16 hidden states of width 4096 take 512 KiB
ALIGNMENT = 16


class SymmetricMemoryUnavailable(RuntimeError):
    """This torch, device or group cannot give a symmetric all-reduce (the group keeps NCCL)."""


@dataclass(frozen=True)
class SymmetricReducer:
    """Per-dtype symmetric buffers of one group and the group name torch's ops know them by."""

    group_name: str
    buffers: dict  # dtype -> 1-D symmetric tensor of max_bytes
    max_bytes: int

    def fits(self, tensor: torch.Tensor) -> bool:
        size = tensor.numel() * tensor.element_size()
        return (tensor.dtype in self.buffers and tensor.device == self.buffers[tensor.dtype].device
                and 0 < size <= self.max_bytes and size % ALIGNMENT == 0)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of `tensor` (contiguous), in a new tensor."""
        local = tensor.contiguous()
        out = torch.empty_like(local)
        buffer = self.buffers[local.dtype][: local.numel()].view(local.shape)
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(buffer, local, "sum", self.group_name, out)
        return out


def open_symmetric_reducer(device_group, group_name: str, rank: int, size: int, store, device: torch.device,
                           max_bytes: int = MAX_BYTES) -> SymmetricReducer:
    """Allocates and rendezvouses this rank's buffers (every rank of the group calls it at once).
    Raises `SymmetricMemoryUnavailable` with the reason when this rank cannot."""
    if device.type != "cuda":
        raise SymmetricMemoryUnavailable(f"{device} is not a CUDA device")
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as error:
        raise SymmetricMemoryUnavailable(f"torch {torch.__version__} has no symmetric memory: {error}") from None
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out"):
        raise SymmetricMemoryUnavailable(f"torch {torch.__version__} has no one_shot_all_reduce_copy_out")
    try:
        _register(device_group, group_name, rank, size, store, symm_mem)
        buffers = {}
        for dtype in DTYPES:
            buffer = symm_mem.empty(max_bytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype,
                                    device=device)
            symm_mem.rendezvous(buffer, group_name)
            buffers[dtype] = buffer
    except (RuntimeError, AttributeError, ImportError, TypeError, ValueError) as error:
        raise SymmetricMemoryUnavailable(f"{type(error).__name__}: {error}".splitlines()[0]) from None
    return SymmetricReducer(group_name, buffers, max_bytes)


def _register(device_group, group_name: str, rank: int, size: int, store, symm_mem) -> None:
    """Makes `group_name` resolve to the group (it was created outside torch's default world),
    and gives symmetric memory the group's store where this torch asks for it."""
    from torch._C._distributed_c10d import _register_process_group

    if hasattr(device_group, "_set_group_name"):
        device_group._set_group_name(group_name)
    _register_process_group(group_name, device_group)
    set_group_info = getattr(getattr(torch._C._distributed_c10d, "_SymmetricMemory", None), "set_group_info", None)
    if set_group_info is not None:  # torch versions whose rendezvous takes the store from here
        try:
            set_group_info(group_name, rank, size, torch.distributed.PrefixStore(f"symmetric/{group_name}", store))
        except RuntimeError as error:
            if "already" not in str(error):
                raise
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None and set_group_info is None:
        enable(group_name)

"""Execution ABI: the tensor-parallel residual update, ``helios::all_reduce_add_rms_norm``.

``helios::all_reduce_add_rms_norm(Tensor x, Tensor partial, Tensor weight, float eps, int ranks)
-> (Tensor, Tensor)``
    ``s = x + all_reduce(partial)`` and ``rms_norm(s)``: one rank's row-parallel output (o or down
    projection, without bias) summed over the ranks, added to the residual stream `x`, and the next
    norm of `s`. x and partial [N, D] of one dtype, weight [D]. Returns (s, normed), identical on
    every rank.

It is exactly ``helios::all_reduce`` followed by ``helios::add_rms_norm`` (the unfused sequence a
tensor-parallel layer ran before): on the CPU bit for bit the same ops (gloo sums, then the
reference add and norm); on CUDA the group's all-reduce (the one-shot symmetric-memory kernel for
small tensors when the group has it, else NCCL) feeding the fused Triton add-norm kernel, which
rounds as ``helios::add_rms_norm`` does. One op per layer boundary instead of two saves a
dispatched call per boundary on the CPU, where a program's calls are the step's cost; on the device
the op is the seam where a single kernel (peers' partial sums read over NVLink, added and normed in
one pass) can replace the pair without touching a prepared program.

Like the collectives it needs a rank group: a program's calls are bound to it at load
(`helios.abi.collectives.bind_collectives`); an unbound call raises `CollectiveError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helios.abi.collectives import CollectiveError, RankGroup, register_group_op
from helios.abi.fused import check_add_rms_norm_args, reference_add_rms_norm
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError

SCHEMA = "(Tensor x, Tensor partial, Tensor weight, float eps, int ranks) -> (Tensor, Tensor)"
_OP = "helios::all_reduce_add_rms_norm"


def _check(x, partial, weight, ranks) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise AbiArgumentError(f"{_OP}: ranks must be an int >= 2, got {ranks!r}")
    check_add_rms_norm_args(x, partial, weight)


@dataclass(frozen=True)
class GroupResidualNorm:
    """The op bound to one rank group."""

    group: RankGroup

    def all_reduce_add_rms_norm(self, x: torch.Tensor, partial: torch.Tensor, weight: torch.Tensor, eps: float,
                                ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check(x, partial, weight, ranks)
        if self.group.size != ranks:
            raise AbiArgumentError(f"{_OP}: the program was captured for {ranks} ranks; the bound group has "
                                   f"{self.group.size}")
        summed = self.group.all_reduced(partial.contiguous())
        if x.device.type == "cpu":
            return reference_add_rms_norm(x, summed, weight, eps)
        return torch.ops.helios.add_rms_norm(x, summed, weight, eps)


@abi_op(_OP, mutates_args=(), schema=SCHEMA)
def all_reduce_add_rms_norm(x: torch.Tensor, partial: torch.Tensor, weight: torch.Tensor, eps: float,
                            ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, partial, weight, ranks)
    raise CollectiveError(f"{_OP}: no rank group is bound to this program (a tensor-parallel program ran alone; "
                          "bind it with bind_collectives)")


@all_reduce_add_rms_norm.register_fake
def _fake(x, partial, weight, eps, ranks):
    _check(x, partial, weight, ranks)
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


register_group_op(all_reduce_add_rms_norm, lambda group: GroupResidualNorm(group).all_reduce_add_rms_norm)

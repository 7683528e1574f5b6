"""Execution ABI: tensor-parallel collectives (namespace ``helios``).

Importing this module registers three custom ops. A tensor-parallel program calls them between its
sharded projections; ``torch.export`` records them as opaque calls, so a saved program depends on
their schemas only. The program itself is rank-agnostic: which ranks take part is decided at run
time by the `RankGroup` the runtime binds to the calling thread (`bind_group`) around each program
call. One process may therefore hold several ranks (one thread each, each with its own binding).

``helios::all_reduce(Tensor x, int ranks) -> Tensor``
    The elementwise sum of `x` over every rank, in a new tensor of x's shape and dtype.
``helios::all_gather(Tensor x, int ranks) -> Tensor``
    [ranks, *x.shape]: entry r is rank r's `x` (rank-major; the program reshapes it).
``helios::broadcast(Tensor x, int ranks, int src) -> Tensor``
    Rank `src`'s `x` on every rank (rank-zero values such as proposal confidence, computed once
    and shared before a decision every rank must make identically).

`ranks` is the world size the program was captured for; it must equal the bound group's size
(`AbiArgumentError` otherwise: a core captured for another rank count). Results are identical on
every rank, bit for bit: each reduced element is computed once and then distributed.

Failures are `CollectiveError` (an `ExecutionError`): no bound group, a peer that closed its
connection (a rank died), or a peer that did not answer within the group's timeout (a rank hangs).
The timeout bounds every call: a collective never waits forever.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch

from helios.abi.registry import AbiArgumentError
from helios.errors import ExecutionError

ALL_REDUCE_SCHEMA = "(Tensor x, int ranks) -> Tensor"
ALL_GATHER_SCHEMA = "(Tensor x, int ranks) -> Tensor"
BROADCAST_SCHEMA = "(Tensor x, int ranks, int src) -> Tensor"
_REDUCE, _GATHER, _BROADCAST = "helios::all_reduce", "helios::all_gather", "helios::broadcast"


class CollectiveError(ExecutionError):
    """A collective could not complete: no bound group, a dead peer or a peer past the timeout."""


@dataclass(frozen=True)
class RankGroup:
    """One rank's handle on a `torch.distributed` process group (gloo on CPU, NCCL on CUDA).

    `process_group` is a ProcessGroup object created for exactly these ranks (never the process's
    default group), so several groups, and several ranks as threads, can live in one process.
    Calls block the calling thread until every rank has joined them or `timeout` has passed.
    """

    process_group: object
    rank: int
    size: int
    timeout: timedelta

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sums `tensor` over the ranks, in place."""
        self._wait(self.process_group.allreduce([tensor]), "all_reduce")

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor`, in rank order."""
        gathered = [torch.empty_like(tensor) for _ in range(self.size)]
        self._wait(self.process_group.allgather([gathered], [tensor]), "all_gather")
        return gathered

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrites `tensor` with rank `src`'s, in place."""
        options = torch.distributed.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self._wait(self.process_group.broadcast([tensor], options), "broadcast")

    def _wait(self, work, name: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as error:  # gloo/NCCL report peer loss and timeouts as RuntimeError
            raise CollectiveError(f"{name} on rank {self.rank} of {self.size} failed: {_first_line(error)}") from error


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


_bound = threading.local()


@contextlib.contextmanager
def bind_group(group: RankGroup | None) -> Iterator[None]:
    """Binds `group` to the calling thread for the collectives of the programs it calls."""
    previous = getattr(_bound, "group", None)
    _bound.group = group
    try:
        yield
    finally:
        _bound.group = previous


def bound_group(op: str, ranks: int) -> RankGroup:
    group = getattr(_bound, "group", None)
    if group is None:
        raise CollectiveError(f"{op}: no rank group is bound to this thread (a tensor-parallel program ran alone)")
    if group.size != ranks:
        raise AbiArgumentError(f"{op}: the program was captured for {ranks} ranks; the bound group has {group.size}")
    return group


def _check(op: str, x: torch.Tensor, ranks: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise AbiArgumentError(f"{op}: x must be a Tensor, got {type(x).__name__}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise AbiArgumentError(f"{op}: ranks must be an int >= 2, got {ranks!r}")


@torch.library.custom_op(_REDUCE, mutates_args=(), schema=ALL_REDUCE_SCHEMA)
def all_reduce(x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_REDUCE, x, ranks)
    out = x.contiguous().clone()
    bound_group(_REDUCE, ranks).all_reduce(out)
    return out


@all_reduce.register_fake
def _all_reduce_fake(x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_REDUCE, x, ranks)
    return torch.empty_like(x)


@torch.library.custom_op(_GATHER, mutates_args=(), schema=ALL_GATHER_SCHEMA)
def all_gather(x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_GATHER, x, ranks)
    return torch.stack(bound_group(_GATHER, ranks).all_gather(x.contiguous()))


@all_gather.register_fake
def _all_gather_fake(x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_GATHER, x, ranks)
    return x.new_empty((ranks, *x.shape))


@torch.library.custom_op(_BROADCAST, mutates_args=(), schema=BROADCAST_SCHEMA)
def broadcast(x: torch.Tensor, ranks: int, src: int) -> torch.Tensor:
    _check(_BROADCAST, x, ranks)
    if not 0 <= src < ranks:
        raise AbiArgumentError(f"{_BROADCAST}: src {src} is not a rank below {ranks}")
    out = x.contiguous().clone()
    bound_group(_BROADCAST, ranks).broadcast(out, src)
    return out


@broadcast.register_fake
def _broadcast_fake(x: torch.Tensor, ranks: int, src: int) -> torch.Tensor:
    _check(_BROADCAST, x, ranks)
    return torch.empty_like(x)

"""Execution ABI: tensor-parallel collectives (namespace ``helios``).

Importing this module registers three custom ops. A tensor-parallel program calls them between its
sharded projections; ``torch.export`` records them as opaque calls, so a saved program depends on
their schemas only. The program itself is rank-agnostic: which ranks take part is decided when the
runtime binds a loaded program to its rank's `RankGroup` (`bind_collectives`, once, after the group
is formed and before any CUDA graph is captured): every call of these ops in the program's graph
then calls the op body with that group as an explicit argument (`GroupCollectives`). No thread or
global state is involved, so one process may hold several ranks (each with its own programs). A
call of the registered op itself (a program that was never bound) raises `CollectiveError`.

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

Devices: a CPU tensor goes through the group's gloo process group, a device (CUDA) tensor through
its NCCL process group (`RankGroup.device_group`), or, for an all-reduce of a small tensor, through
the group's one-shot symmetric-memory reducer when the group was formed with one
(`helios.abi.symmetric_reduce`: every rank sums every rank's buffer in rank order, on its stream). On the device an op only enqueues: NCCL runs the
collective on its own stream and the caller's stream waits for it, so the op body never
synchronises with the host, allocates its output from the input's shape alone and can be captured
into a CUDA graph. NCCL's all-reduce algorithms (ring, tree) also reduce each element along one
path and copy the result to every rank, so the results agree bit for bit on the device too (and
the runtime's cohort agreement compares every step's completion records).

Failures are `CollectiveError` (an `ExecutionError`): no bound group, a peer that closed its
connection (a rank died), or a peer that did not answer within the group's timeout (a rank hangs).
On the CPU the timeout bounds every call: a collective never waits forever. On the device the host
does not wait, so nothing can time out inside the op; the runtime bounds each step's device work
instead and aborts the NCCL communicator when a step overruns (`helios.runtime.parallel.rank_deadline`),
which ends every collective still waiting on a lost rank.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta

import torch

from helios.abi.op_library import abi_op
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
    """One rank's handle on its `torch.distributed` process groups.

    `process_group` (gloo) carries every CPU tensor: the runtime's control messages and, on a CPU
    model, the programs' collectives. `device_group` (NCCL, None on a CPU model) carries the
    collectives of device tensors; each call picks the group by its tensor's device. Both are
    ProcessGroup objects created for exactly these ranks (never the process's default group), so
    several groups, and several CPU ranks as threads, can live in one process.

    CPU calls block the calling thread until every rank has joined them or `timeout` has passed.
    Device calls only enqueue the collective and make the caller's current stream wait for it
    (no host synchronisation; see the module docstring for what bounds them).
    """

    process_group: object
    rank: int
    size: int
    timeout: timedelta
    device_group: object | None = None
    reducer: object | None = None  # `helios.abi.symmetric_reduce.SymmetricReducer`, when every rank has one

    @property
    def all_reduce_path(self) -> str:
        """How the programs' all-reduces run: "symmetric" (one-shot for small device tensors, NCCL
        above), "nccl", or "gloo" (a CPU model)."""
        if self.reducer is not None:
            return "symmetric"
        return "nccl" if self.device_group is not None else "gloo"

    def all_reduced(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of `tensor` (contiguous) over the ranks, in a new tensor: a small device tensor
        through the one-shot symmetric reducer when the group has one, everything else `all_reduce`."""
        if self.reducer is not None and tensor.device.type != "cpu" and self.reducer.fits(tensor):
            return self.reducer.all_reduce(tensor)
        out = tensor.clone()
        self.all_reduce(out)
        return out

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sums `tensor` over the ranks, in place."""
        group = self._group_for(tensor, "all_reduce")
        self._wait(self._call(lambda: group.allreduce([tensor]), "all_reduce"), tensor, "all_reduce")

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor`, in rank order (new tensors)."""
        gathered = tensor.new_empty((self.size, *tensor.shape))
        self.all_gather_into(gathered, tensor)
        return list(gathered.unbind(0))

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        """Writes rank r's `tensor` into ``out[r]``; `out` is contiguous, [size, *tensor.shape]."""
        group = self._group_for(tensor, "all_gather")
        if tensor.device.type == "cpu":  # gloo copies each rank's tensor into the views of `out`
            work = self._call(lambda: group.allgather([list(out.unbind(0))], [tensor]), "all_gather")
        else:  # one NCCL all-gather straight into `out`
            work = self._call(lambda: group._allgather_base(out, tensor), "all_gather")
        self._wait(work, tensor, "all_gather")

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrites `tensor` with rank `src`'s, in place."""
        group = self._group_for(tensor, "broadcast")
        options = torch.distributed.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self._wait(self._call(lambda: group.broadcast([tensor], options), "broadcast"), tensor, "broadcast")

    def abort(self) -> None:
        """Aborts the device group (no-op without one): collectives still waiting on it, queued on
        the device or replayed from a CUDA graph, end instead of waiting for a lost rank. The
        group is unusable afterwards; a rank that leaves the group also ends it this way (no wait
        on the others). Idempotent; safe from any thread, also while another thread waits."""
        if self.device_group is not None:
            with contextlib.suppress(RuntimeError):  # already aborted or torn down
                self.device_group.abort()

    def _group_for(self, tensor: torch.Tensor, name: str):
        if tensor.device.type == "cpu":
            return self.process_group
        if self.device_group is None:
            raise CollectiveError(f"{name} on rank {self.rank}: a {tensor.device} tensor, but the group has no "
                                  "device process group (it was formed for a CPU model)")
        return self.device_group

    def _call(self, start, name: str):
        try:
            return start()
        except RuntimeError as error:  # NCCL refuses to enqueue on an aborted or broken communicator
            raise CollectiveError(f"{name} on rank {self.rank} of {self.size} failed: {_first_line(error)}") from error

    def _wait(self, work, tensor: torch.Tensor, name: str) -> None:
        # CPU: block up to the timeout. Device: only order the current stream after the collective;
        # a timeout here would make NCCL block the host until completion (no graph capture).
        self._call(lambda: work.wait(self.timeout) if tensor.device.type == "cpu" else work.wait(), name)


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _group_of(group: RankGroup | None, op: str, ranks: int) -> RankGroup:
    if group is None:
        raise CollectiveError(f"{op}: no rank group is bound to this program (a tensor-parallel program ran alone; "
                              "bind it with bind_collectives)")
    if group.size != ranks:
        raise AbiArgumentError(f"{op}: the program was captured for {ranks} ranks; the bound group has {group.size}")
    return group


@dataclass(frozen=True)
class GroupCollectives:
    """The three collective ops with their rank group as an explicit argument: what a bound
    program calls (`bind_collectives`). Same signatures and results as the registered ops."""

    group: RankGroup

    def all_reduce(self, x: torch.Tensor, ranks: int) -> torch.Tensor:
        return _all_reduce(self.group, x, ranks)

    def all_gather(self, x: torch.Tensor, ranks: int) -> torch.Tensor:
        return _all_gather(self.group, x, ranks)

    def broadcast(self, x: torch.Tensor, ranks: int, src: int) -> torch.Tensor:
        return _broadcast(self.group, x, ranks, src)


# Every op whose body needs a rank group: AbiOp -> function(group) -> the op's body bound to that
# group. The three collectives below register here, and so do the ABI ops that combine a collective
# with local work (`helios.abi.vocab_shards`, `helios.abi.reduce_norm`) when their module is imported
# (`helios.abi` imports every op module). Filled at import, never changed while serving.
_GROUP_OPS: dict = {}


def register_group_op(op, bind) -> None:
    """Declares `op` (a `helios.abi.op_library.AbiOp`) a group op: `bind_collectives` points its calls
    at ``bind(group)``, a callable with the op's signature."""
    _GROUP_OPS[op] = bind


def bind_collectives(graph: torch.fx.Graph, group: RankGroup) -> int:
    """Points every call of a group op in `graph` (the three collectives and every op registered
    with `register_group_op`; the registered op, or its Python body where a CPU program calls bodies
    directly) at its body bound to `group`; returns how many calls were bound. The caller
    recompiles the graph's module."""
    targets = {}
    for op, bind in _GROUP_OPS.items():
        method = bind(group)
        targets[op.overload] = method
        targets[op.body] = method
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target in targets:
            node.target = targets[node.target]
            count += 1
    return count


def _check(op: str, x: torch.Tensor, ranks: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise AbiArgumentError(f"{op}: x must be a Tensor, got {type(x).__name__}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise AbiArgumentError(f"{op}: ranks must be an int >= 2, got {ranks!r}")


def _all_reduce(group: RankGroup | None, x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_REDUCE, x, ranks)
    return _group_of(group, _REDUCE, ranks).all_reduced(x.contiguous())


def _all_gather(group: RankGroup | None, x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_GATHER, x, ranks)
    out = x.new_empty((ranks, *x.shape))
    _group_of(group, _GATHER, ranks).all_gather_into(out, x.contiguous())
    return out


def _broadcast(group: RankGroup | None, x: torch.Tensor, ranks: int, src: int) -> torch.Tensor:
    _check(_BROADCAST, x, ranks)
    if not 0 <= src < ranks:
        raise AbiArgumentError(f"{_BROADCAST}: src {src} is not a rank below {ranks}")
    out = x.contiguous().clone()
    _group_of(group, _BROADCAST, ranks).broadcast(out, src)
    return out


@abi_op(_REDUCE, mutates_args=(), schema=ALL_REDUCE_SCHEMA)
def all_reduce(x: torch.Tensor, ranks: int) -> torch.Tensor:
    return _all_reduce(None, x, ranks)


@all_reduce.register_fake
def _all_reduce_fake(x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_REDUCE, x, ranks)
    return torch.empty_like(x)


@abi_op(_GATHER, mutates_args=(), schema=ALL_GATHER_SCHEMA)
def all_gather(x: torch.Tensor, ranks: int) -> torch.Tensor:
    return _all_gather(None, x, ranks)


@all_gather.register_fake
def _all_gather_fake(x: torch.Tensor, ranks: int) -> torch.Tensor:
    _check(_GATHER, x, ranks)
    return x.new_empty((ranks, *x.shape))


@abi_op(_BROADCAST, mutates_args=(), schema=BROADCAST_SCHEMA)
def broadcast(x: torch.Tensor, ranks: int, src: int) -> torch.Tensor:
    return _broadcast(None, x, ranks, src)


@broadcast.register_fake
def _broadcast_fake(x: torch.Tensor, ranks: int, src: int) -> torch.Tensor:
    _check(_BROADCAST, x, ranks)
    return torch.empty_like(x)


register_group_op(all_reduce, lambda group: GroupCollectives(group).all_reduce)
register_group_op(all_gather, lambda group: GroupCollectives(group).all_gather)
register_group_op(broadcast, lambda group: GroupCollectives(group).broadcast)

"""Starting and watching the ranks of a tensor-parallel core (the spec's RankPeers).

Rank zero (the serving process) calls `launch_peers`, loads its own rank while the peers load
theirs, then `PendingRanks.join` (`start_ranks` does both around an already loaded rank zero):

* serves the rendezvous (`helios.runtime.parallel.rank_rendezvous`) and publishes its launch choices;
* starts the local peers, ranks 1 .. local_ranks - 1, as `PeerKind.PROCESSES` (one
  ``helios rank --join`` process each, the default) or `PeerKind.THREADS` (threads of this
  process, CPU models only); ranks from local_ranks on join from other hosts with
  ``helios rank --join HOST:PORT``;
* waits until every rank has loaded the same core (or fails with a typed `LoadError`), forms the
  group and returns `RankPeers`, whose `executor` replaces the engine's executor.

On CUDA (`helios.runtime.parallel.rank_devices`) local rank r runs on ``cuda:(B + r)`` where rank zero runs
on ``cuda:B``, the programs' collectives go through NCCL, and, when rank zero's load options ask
for CUDA graphs (`LoadOptions.cuda_graphs`), every rank captures its programs right after the
group is formed (`capture_rank`), not while it loads: capture runs each program eagerly first, and
its collectives need every rank's group. Every rank binds its programs' collectives to its group
(`bind_rank`, an explicit load-time rewrite of each program's graph) as soon as the group is formed. Every rank therefore loads a tensor-parallel core
with ``cuda_graphs=False`` (`helios.runtime.service` does so for rank zero).

Why processes are the default for local peers on the CPU: gloo itself runs several ranks as
threads of one process (each rank creates its own ProcessGroup object), but an exported program is
executed op by op by the Python interpreter, so rank threads hold the GIL for everything except the
kernels themselves and mostly take turns; processes run the ranks in parallel, and a rank that dies
takes only itself down, which rank zero then reports. Threads start faster and share one verified
core, which suits tests and very small models.

`RankPeers` watches the peers while the model runs: a local peer that exits, or an idle group whose
keepalive exchange fails, marks the model failed (requests end with an execution error, health
turns false). `close` stops the peers after the engine has stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator

import torch

from helios.abi.collectives import RankGroup, bind_collectives
from helios.errors import LoadError
from helios.runtime.loading.cpu_programs import CpuProgram
from helios.runtime.loading.cuda_graphs import CaptureError, CapturedProgram, release_graphs
from helios.runtime.execution.executor import Executor, GraphExecutor
from helios.runtime.execution.program_variants import program_table, variant_name
from helios.runtime.loading.model import LoadOptions, load_model, serving_device
from helios.runtime.execution.host_staging import host_staging
from helios.runtime.execution.packer import Packer
from helios.runtime.parallel.rank_devices import (
    RankBackend,
    UnsupportedRanksError,
    check_nccl_environment,
    join_device,
    place_local_ranks,
    share_local_threads,
)
from helios.runtime.parallel.rank_rendezvous import (
    Launch,
    RankIdentity,
    RankJoinError,
    Rendezvous,
    Sizing,
    serve_address,
)
from helios.runtime.parallel.rank_options import PeerKind, RankOptions
from helios.runtime.parallel.ranks import RankedExecutor, serve_rank
from helios.runtime.records.stats import WorkerStats

__all__ = ["PeerKind", "PendingRanks", "RankOptions", "RankPeers", "UnsupportedRanksError", "bind_rank",
           "capture_rank", "join_rank", "launch_peers", "start_ranks"]


class RankPeers:
    """Rank zero's peers, their monitor and the `RankedExecutor`. Owned by the runtime."""

    def __init__(self, executor: RankedExecutor, peers: list, keepalive_s: float, threads_before: int | None = None):
        self.executor = executor
        self._peers = peers
        self._threads_before = threads_before  # rank zero's own thread count before its share (restored at close)
        self._closing = threading.Event()
        self._monitor = threading.Thread(target=self._watch, args=(keepalive_s,), name="helios-rank-monitor",
                                         daemon=True)
        self._monitor.start()

    @property
    def peer_executors(self) -> tuple[Executor | None, ...]:
        """The executors of the local peers that are threads of this process, in rank order (None
        for one not serving yet): their packers hold the request records rank zero's plans gave them."""
        return tuple(peer.executor for peer in self._peers if isinstance(peer, _ThreadPeer))

    @property
    def live_peers(self) -> tuple[int, ...]:
        """Ranks of the local peers (threads or processes) still running."""
        return tuple(peer.rank for peer in self._peers if peer.lost() is None)

    @property
    def local_pids(self) -> tuple[int, ...]:
        """Process ids of the local rank processes (none when the peers are threads)."""
        return tuple(peer.process.pid for peer in self._peers if isinstance(peer, _ProcessPeer))

    def _watch(self, keepalive_s: float) -> None:
        while not self._closing.wait(min(keepalive_s, 0.5)):
            reason = _first_lost(self._peers)
            if reason is not None:
                self.executor.mark_failed(reason)
                return
            self.executor.keepalive(keepalive_s)
            if self.executor.failure is not None:
                return

    def close(self, timeout: float = 10.0) -> None:
        """Stops every peer (call after the engine stopped). Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self.executor.stop()
        for peer in self._peers:
            peer.stop(timeout)
        _restore_threads(self._threads_before)


def start_ranks(core, executor: Executor, stats: WorkerStats, options: RankOptions, host_pages: int,
                load: LoadOptions = LoadOptions()) -> RankPeers:
    """Starts and joins every rank of `core` around rank zero's loaded `executor`, which was loaded
    with `load` but without CUDA graphs (every rank loads with the same startup options; with
    ``load.cuda_graphs`` on CUDA every rank captures once the group is formed). `launch_peers`
    then `PendingRanks.join` does the same with the peers loading while rank zero loads."""
    model = executor.model
    pending = launch_peers(core, options, host_pages, load, model.device, model.prepared.manifest.ranks)
    return pending.join(executor, stats)


def launch_peers(core, options: RankOptions, host_pages: int, load: LoadOptions = LoadOptions(),
                 device: torch.device | None = None, ranks: int | None = None) -> "PendingRanks":
    """Serves the rendezvous, publishes the `Launch` and starts the local peers, which load their
    shards at once; rank zero loads its own model meanwhile, then calls `PendingRanks.join` (or
    `abandon` when its load failed). `device` and `ranks` default to the load's and the core's."""
    device = serving_device(load.device) if device is None else device
    ranks = core.prepared.manifest.ranks if ranks is None else ranks
    local = options.local_ranks or ranks
    if not 1 <= local <= ranks:
        raise UnsupportedRanksError(f"{local} local ranks for a core of {ranks} ranks")
    placement = place_local_ranks(device, local, threads=options.peers is PeerKind.THREADS)
    nccl = placement.backend is RankBackend.NCCL
    if nccl:
        check_nccl_environment()
    rendezvous = _rendezvous(options, local < ranks)
    launch = Launch(RankIdentity.of(core.prepared), load.startup, host_pages, local, options.collective_timeout_s,
                    placement.backend.value, nccl and load.cuda_graphs, options.join_timeout_s,
                    nccl and options.symmetric_all_reduce)
    rendezvous.publish(launch)
    options, threads_before = _with_local_threads(options, local, nccl)
    peers = [_start_peer(core, rendezvous, r, options, placement.devices[r]) for r in range(1, local)]
    return PendingRanks(rendezvous, launch, peers, placement, options, threads_before)


def _with_local_threads(options: RankOptions, local: int, nccl: bool) -> tuple[RankOptions, int | None]:
    """`options` with each local rank process's intra-op threads decided (`share_local_threads`:
    CPU rank processes split rank zero's threads unless `torch_threads` is set), and rank zero's
    thread count before the split where it changed it (restored by `_restore_threads`)."""
    cpu_processes = not nccl and options.peers is PeerKind.PROCESSES
    threads, before = share_local_threads(options.torch_threads, local, cpu_processes)
    if threads is None:
        return options, None
    return dataclasses.replace(options, torch_threads=threads), before


def _restore_threads(before: int | None) -> None:
    if before is not None:
        torch.set_num_threads(before)


@dataclass
class PendingRanks:
    """Peers started and loading (`launch_peers`), not yet joined into a group."""

    rendezvous: Rendezvous
    launch: Launch
    peers: list
    placement: object  # RankPlacement
    options: RankOptions
    threads_before: int | None = None  # rank zero's thread count before its share (`_with_local_threads`)

    def join(self, executor: Executor, stats: WorkerStats) -> RankPeers:
        """Publishes rank zero's sizing, waits for every rank, forms the group (captures on CUDA)."""
        model, launch, peers = executor.model, self.launch, self.peers
        nccl = self.placement.backend is RankBackend.NCCL
        timeout = timedelta(seconds=self.options.collective_timeout_s)
        self.rendezvous.publish_sizing(Sizing(model.num_pages, tuple(variant_name(p) for p in model.programs)))
        group, formation = None, False
        try:
            self.rendezvous.wait_ready(range(1, launch.ranks), self.options.join_timeout_s, lambda: _first_lost(peers))
            self.rendezvous.publish_formation()
            formation = True
            group = self.rendezvous.form_group(0, launch.ranks, timeout, self.placement.devices[0] if nccl else None,
                                               symmetric=launch.symmetric_all_reduce)
            bind_rank(executor.model, group)
            if launch.cuda_graphs:
                executor = capture_rank(executor, launch.host_pages)
        except BaseException:
            if group is not None:
                group.abort()
            self._stop(told_to_form=formation)
            raise
        # A failed group takes its local peers down with it.
        ranked = RankedExecutor(executor, group, stats, on_failure=lambda reason: [peer.kill() for peer in peers])
        return RankPeers(ranked, peers, self.options.collective_timeout_s / 4, self.threads_before)

    def abandon(self, reason: str) -> None:
        """Rank zero could not load: every peer gives up (remote ones learn why), local ones stop."""
        self.rendezvous.publish_sizing(Sizing(0, (), reason or "unknown error"))
        self._stop()

    def _stop(self, told_to_form: bool = False) -> None:
        """Stops the local peers; peers already ready wait for rank zero's word unless it was told
        (`told_to_form`: a stop then would wait on the store's client, which the group formation
        that a stop signal interrupted may still hold for the group's timeout)."""
        if not told_to_form:
            self.rendezvous.publish_formation(go=False)
        for peer in self.peers:
            peer.stop(0.0)
        _restore_threads(self.threads_before)


def bind_rank(model, group: RankGroup) -> int:
    """Binds the collectives of every program of `model` (this rank's, not yet captured) to
    `group`, in place (`helios.abi.collectives.bind_collectives`); returns how many calls were
    bound. Programs without collectives are left as they are."""
    count = 0
    for program in (*model.programs, *model.vision_programs):
        module = program.module
        if isinstance(module, CapturedProgram):
            raise CaptureError(f"program {program.graph} was captured before its collectives were bound")
        graph_module = module.module if isinstance(module, CpuProgram) else module
        bound = bind_collectives(graph_module.graph, group)
        if bound:
            module.recompile()
        count += bound
    return count


def capture_rank(executor: Executor, host_pages: int) -> GraphExecutor:
    """An executor of the same model whose programs replay CUDA graphs captured now (their
    collectives already bound, `bind_rank`; every rank must call this at the same point: the
    warm-up runs meet in collectives)."""
    from helios.runtime.loading.cuda_graphs import capture_programs  # CUDA only
    from helios.runtime.loading.model import program_arguments, tuned_outputs

    model = executor.model

    def capture(programs):
        return capture_programs(programs, lambda p: program_arguments(p, model.weights, model.buffers),
                                model.buffers, model.device, keep=tuned_outputs(model.prepared)) if programs else ()

    # The programs a step runs beside its own (slot initializers, state copies) replay too.
    captured = dataclasses.replace(model, programs=capture(model.programs),
                                   initialization_programs=capture(model.initialization_programs),
                                   state_copy_programs=capture(model.state_copy_programs))
    return GraphExecutor(captured, executor.packer, program_table(captured), host_pages)


def _rendezvous(options: RankOptions, has_remote: bool) -> Rendezvous:
    if options.peers is PeerKind.THREADS and not has_remote:
        return Rendezvous.in_process()
    host, port = serve_address(options.rendezvous)  # AddressError, a RankJoinError, when it cannot
    if has_remote and port == 0:  # refused at once: rank zero would wait its whole join timeout
        raise UnsupportedRanksError(f"ranks from {options.local_ranks} on join from other hosts, but rendezvous "
                                    f"{options.rendezvous} picks a free port they cannot know: give --rendezvous "
                                    "HOST:PORT with the port they join")
    return Rendezvous.serve(host, port, timedelta(seconds=options.join_timeout_s))


def join_rank(core, rendezvous: Rendezvous, rank: int | None, device: str | None = None,
              launch_timeout: timedelta = timedelta(seconds=60),
              on_joined: Callable[[int, int], None] = lambda rank, ranks: None,
              on_serving: Callable[[Executor], None] = lambda executor: None) -> None:
    """A peer: take a rank, check the core, load it, join the group and serve until rank zero stops.

    `device`: this rank's (None: ``cpu`` when rank zero runs on the CPU, ``cuda:0`` when it runs on
    CUDA). `on_joined(rank, ranks)` runs once the group is formed, `on_serving(executor)` with the
    executor this rank then serves (a thread peer keeps it: `RankPeers.peer_executors`). Raises
    `RankJoinError` / `MissingRankError` / `UnsupportedRanksError` (startup) or `CollectiveError` (the group broke).
    """
    launch = rendezvous.read_launch(launch_timeout)
    rank = rendezvous.next_remote_rank(launch.first_remote_rank) if rank is None else rank
    if not 1 <= rank < launch.ranks:
        raise RankJoinError(f"rank {rank} is not a peer rank of a {launch.ranks}-rank group (is it full?)")
    rendezvous.claim(rank)  # a second claimant is refused here, before it could answer for the rank
    try:
        placed = join_device(RankBackend(launch.backend), device)  # checks that the GPU is visible
        if placed.type == "cuda":
            check_nccl_environment()
            torch.cuda.set_device(placed)  # this process's CUDA work (and NCCL's) goes to its GPU
        executor = _load_rank(core, launch, rank, str(placed), rendezvous)
    except Exception as error:  # rank zero learns why at once, not at its join timeout
        rendezvous.reject(rank, str(error) if isinstance(error, LoadError) else f"{type(error).__name__}: {error}")
        raise
    rendezvous.mark_ready(rank)
    rendezvous.await_formation(timedelta(seconds=launch.join_timeout_s))  # the last rank may come much later
    group = rendezvous.form_group(rank, launch.ranks, timedelta(seconds=launch.collective_timeout_s),
                                  placed if launch.backend == RankBackend.NCCL.value else None,
                                  symmetric=launch.symmetric_all_reduce)
    try:
        bind_rank(executor.model, group)
        if launch.cuda_graphs:
            executor = capture_rank(executor, launch.host_pages)
        on_joined(rank, launch.ranks)
        on_serving(executor)
        serve_rank(executor, group)
    finally:
        release_graphs(executor.model.programs)  # NCCL teardown waits for the graphs that use it
        group.abort()  # releases the NCCL communicator (no-op for gloo) without waiting on the others


def _load_rank(core, launch: Launch, rank: int, device: str, rendezvous: Rendezvous) -> Executor:
    reason = launch.identity.mismatch(RankIdentity.of(core.prepared))
    if reason is not None:
        raise RankJoinError(f"rank {rank} cannot join: {reason}")
    # Captured after the group is formed, if at all (see the module docstring). Programs and
    # weights load while rank zero loads; the page count waits for rank zero's sizing.
    sizing: list[Sizing] = []

    def pages() -> int:
        sizing.append(rendezvous.read_sizing(timedelta(seconds=launch.join_timeout_s)))
        return sizing[0].num_pages

    options = LoadOptions(launch.startup, device, rank=rank, cuda_graphs=False)
    model = load_model(core, options, pages=pages)
    variants = tuple(variant_name(p) for p in model.programs)
    if variants != sizing[0].variants:
        raise RankJoinError(f"rank {rank} selected variants {variants}; rank zero {sizing[0].variants}")
    packer = Packer(model.prepared, model.buffers, model.state_rows_per_request,
                    host_staging=host_staging(model.prepared, model.weights, model.buffers))
    return Executor(model, packer, program_table(model), launch.host_pages)


class _ThreadPeer:
    def __init__(self, core, rendezvous: Rendezvous, rank: int):
        self.rank = rank
        self.error: BaseException | None = None
        self.executor: Executor | None = None  # this rank's, once it serves
        self._thread = threading.Thread(target=self._run, args=(core, rendezvous), name=f"helios-rank-{rank}",
                                        daemon=True)
        self._thread.start()

    def _run(self, core, rendezvous) -> None:
        try:
            join_rank(core, rendezvous, self.rank, on_serving=self._serving)
        except BaseException as error:  # noqa: BLE001 - reported to rank zero through lost()
            self.error = error

    def _serving(self, executor: Executor) -> None:
        self.executor = executor

    def lost(self) -> str | None:
        if self._thread.is_alive():
            return None
        detail = f": {type(self.error).__name__}: {self.error}" if self.error else ""
        return f"rank {self.rank} (thread) ended{detail}"

    def kill(self) -> None:
        pass  # a thread cannot be killed; its next collective fails with the group

    def stop(self, timeout: float) -> None:
        self._thread.join(timeout)


class _ProcessPeer:
    def __init__(self, command: list[str], rank: int, pass_fds: tuple[int, ...] = ()):
        self.rank = rank
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        pass_fds=pass_fds)

    def lost(self) -> str | None:
        code = self.process.poll()
        return None if code is None else f"rank {self.rank} (process {self.process.pid}) exited with status {code}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def stop(self, timeout: float) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _first_lost(peers) -> str | None:
    return next((reason for reason in (peer.lost() for peer in peers) if reason is not None), None)


def _start_peer(core, rendezvous: Rendezvous, rank: int, options: RankOptions, device: torch.device):
    if options.peers is PeerKind.THREADS:  # CPU only (place_local_ranks)
        return _ThreadPeer(core, rendezvous.for_thread(timedelta(seconds=options.join_timeout_s)), rank)
    with _trust_pipes(core.admitted_signers) as fds:
        return _ProcessPeer(_rank_command(core, rendezvous.address, rank, options, device, fds), rank, fds)


@contextlib.contextmanager
def _trust_pipes(keys) -> Iterator[tuple[int, ...]]:
    """The read ends of one pipe per key, each holding the key's line (a rank process reads them as
    ``--trust /dev/fd/N``), closed here on exit: nothing of them is left on disk, also when this
    process is killed (a directory of key files was, once per start)."""
    fds: list[int] = []
    try:
        for key in keys:
            read, write = os.pipe()
            fds.append(read)
            with os.fdopen(write, "wb") as writer:  # a key line fits a pipe's buffer: never blocks
                writer.write(key.to_line().encode("ascii"))
        yield tuple(fds)
    finally:
        for fd in fds:
            os.close(fd)


def _rank_command(core, address: str, rank: int, options: RankOptions, device: torch.device,
                  trust_fds: tuple[int, ...]) -> list[str]:
    """``helios rank --join`` for a local peer: the same core, trusting the keys rank zero admitted
    (read from the pipes `trust_fds`, which the process inherits)."""
    threads = options.torch_threads or torch.get_num_threads()
    trust = [option for fd in trust_fds for option in ("--trust", f"/dev/fd/{fd}")]
    command = [sys.executable, "-m", "helios.cli.rank_cmd", str(core.path), "--join", address,
               "--rank", str(rank), "--device", str(device), "--accept", core.publisher.namespace,
               *trust, "--torch-threads", str(threads), "--quiet", "--parent", str(os.getpid())]
    if options.aes_key_file:
        command += ["--aes-key", options.aes_key_file]
    return command

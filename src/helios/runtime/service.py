"""Wiring of a verified core into a running engine: load, packer, executor, scheduler, engine.

`start_runtime` is the one place that builds these collaborators (constructors elsewhere take
them), used by offline generation and by the server. A core prepared for N > 1 tensor-parallel
ranks also starts ranks 1..N-1 (`helios.runtime.parallel.rank_peers`) and runs the engine on their
`RankedExecutor`; `Runtime.close` stops the engine and then those ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helios.runtime.host_heap import hold_freed_memory
from helios.runtime.engine import Engine
from helios.runtime.execution.executor import executor_for
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.loading.model import LoadedModel, LoadOptions, load_model
from helios.runtime.execution.host_staging import host_staging
from helios.runtime.execution.packer import Packer
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.parallel.rank_devices import UnsupportedRanksError
from helios.runtime.parallel.rank_peers import RankOptions, RankPeers, launch_peers
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.records.stats import WorkerStats


@dataclass(frozen=True)
class RuntimeOptions:
    load: LoadOptions = LoadOptions()
    queue_capacity: int = 256
    policy: SchedulerPolicy = SchedulerPolicy()
    host_pages: int = 0  # host-memory page slots for offloaded snapshots and preempted requests
    ranks: RankOptions = RankOptions()  # how ranks 1..N-1 of a tensor-parallel core run
    # Fix glibc malloc's thresholds for this process before loading (`helios.runtime.host_heap`):
    # a CPU step's freed tensors stay with the process instead of being faulted in again each step.
    hold_freed_memory: bool = True


@dataclass(frozen=True)
class Runtime:
    model: LoadedModel
    engine: Engine
    peers: RankPeers | None = None  # tensor-parallel ranks 1..N-1; None for a one-rank core

    def close(self) -> None:
        """Stops the engine, then the tensor-parallel peers (idempotent). The peers stop even when
        the engine's shutdown raises (an engine never started winds down in this thread)."""
        try:
            self.engine.shutdown()
        finally:
            if self.peers is not None:
                self.peers.close()


def build_runtime(core, options: RuntimeOptions = RuntimeOptions()) -> Runtime:
    """Loads `core` (already verified and authorized) and builds an engine that is not started."""
    if options.hold_freed_memory:
        hold_freed_memory()
    ranked = core.prepared.manifest.ranks > 1
    if not ranked and (options.ranks.local_ranks or 1) > 1:  # it was ignored: one process served the core
        raise UnsupportedRanksError(f"{options.ranks.local_ranks} local ranks for a core of 1 rank (prepare it "
                                    "with --tensor-parallel to serve it on several)")
    # A tensor-parallel core's peers load their shards while rank zero loads its own; its programs
    # are captured into CUDA graphs once the group is formed (their collectives need every rank);
    # on the CPU they run the eager fast graphs (their collectives are bound after load, so nothing compiled).
    pending = launch_peers(core, options.ranks, options.host_pages, options.load) if ranked else None
    # Every failure before the join abandons the peers, the packer's and the executor's too (a binding
    # refused, host pages that cannot be allocated): otherwise they wait for rank zero's sizing.
    try:
        ranked_load = replace(options.load, cuda_graphs=False, compile_programs=False)
        model = load_model(core, ranked_load if ranked else options.load)
        packer = Packer(model.prepared, model.buffers, model.state_rows_per_request,
                        host_staging=host_staging(model.prepared, model.weights, model.buffers))
        executor = executor_for(model, packer, options.host_pages)
    except BaseException as error:
        if pending is not None:
            pending.abandon(f"{type(error).__name__}: {error}")
        raise
    stats, peers = WorkerStats(), None
    if pending is not None:
        peers = pending.join(executor, stats)
        executor = peers.executor
        model = executor.model  # its programs captured, on CUDA
    try:
        scheduler = Scheduler.create(capacities_for(model, options.queue_capacity, options.host_pages), options.policy)
    except BaseException:
        if peers is not None:
            peers.close()
        raise
    return Runtime(model, Engine(scheduler, executor, stats), peers)

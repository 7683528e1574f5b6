"""Wiring of a verified core into a running engine: load, packer, executor, scheduler, engine.

`start_runtime` is the one place that builds these collaborators (constructors elsewhere take
them), used by offline generation and by the server.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.runtime.engine import Engine
from helios.runtime.executor import Executor, program_table
from helios.runtime.geometry import capacities_for
from helios.runtime.model import LoadedModel, LoadOptions, load_model
from helios.runtime.packer import Packer
from helios.runtime.policy import SchedulerPolicy
from helios.runtime.scheduler import Scheduler
from helios.runtime.stats import WorkerStats


@dataclass(frozen=True)
class RuntimeOptions:
    load: LoadOptions = LoadOptions()
    queue_capacity: int = 256
    policy: SchedulerPolicy = SchedulerPolicy()
    host_pages: int = 0  # host-memory page slots for offloaded snapshots and preempted requests


@dataclass(frozen=True)
class Runtime:
    model: LoadedModel
    engine: Engine


def build_runtime(core, options: RuntimeOptions = RuntimeOptions()) -> Runtime:
    """Loads `core` (already verified and authorized) and builds an engine that is not started."""
    model = load_model(core, options.load)
    packer = Packer(model.prepared, model.buffers, max(1, model.prepared.state_rows_per_request()))
    executor = Executor(model, packer, program_table(model), options.host_pages)
    scheduler = Scheduler.create(capacities_for(model, options.queue_capacity, options.host_pages), options.policy)
    return Runtime(model, Engine(scheduler, executor, WorkerStats()))

"""The executor protocol: what the engine calls to run plans, and nothing else.

Three implementations: `helios.runtime.executor.Executor` (one rank, programs called eagerly),
`helios.runtime.executor.GraphExecutor` (one rank, programs replayed from CUDA graphs captured at
load) and `helios.runtime.ranks.RankedExecutor` (rank zero of a tensor-parallel group). The engine
holds a `PlanExecutor` and never asks which one it has.

Per plan: `handle = launch(plan)` performs the plan's copies, packs its inputs and submits its
program; `finish(handle)` waits for it and returns the validated `StepOutput`. Plans are finished
in launch order. An executor that `overlaps` returns from `launch` before the device is done, so
the engine may launch a second plan before it finishes the first; `alone=True` promises the
caller finishes this plan before launching another (a tensor-parallel group then runs it in one
exchange). A failure may surface from either call; it fails that plan only.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from helios.runtime.execution.step_output import StepOutput
from helios.runtime.execution.images import ImageFeeder
from helios.runtime.loading.model import LoadedModel
from helios.runtime.records.plan import StepPlan


@runtime_checkable
class PlanExecutor(Protocol):
    """See the module docstring. `model` is rank zero's loaded model (read-only); `images` the
    image feeder of a core with vision programs (None otherwise)."""

    model: LoadedModel
    images: ImageFeeder | None

    @property
    def overlaps(self) -> bool:
        """Whether `launch` returns before the device has finished (a second frame pays off)."""
        ...

    def launch(self, plan: StepPlan, *, alone: bool = False) -> object:
        """Submits `plan`; the handle goes to `finish`."""
        ...

    def finish(self, handle: object) -> StepOutput:
        """Waits for a launched plan (the oldest not yet finished) and validates its completion."""
        ...


def run(executor: PlanExecutor, plan: StepPlan) -> StepOutput:
    """Launches `plan` alone and finishes it."""
    return executor.finish(executor.launch(plan, alone=True))

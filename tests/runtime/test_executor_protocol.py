"""One executor protocol: the eager, CUDA-graph and tensor-parallel executors all satisfy
`PlanExecutor`, and the engine drives an executor that offers nothing but the protocol."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest

from helios.runtime.loading.cuda_graphs import CaptureError, CapturedProgram
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.execution.protocol import PlanExecutor, run
from helios.runtime.execution.executor import Executor, GraphExecutor, executor_for
from helios.runtime.execution.program_variants import program_table
from helios.runtime.execution.step_output import StepOutput
from helios.runtime.execution.packer import Packer
from helios.runtime.parallel.ranks import RankedExecutor
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.service import build_runtime
from helios.runtime.records.stats import WorkerStats

from .fake_model import FakeExecutor, reference
from .harness import capacities, spec
from .test_model_fixture import open_fixture


class Replayed(CapturedProgram):
    """A captured program's stand-in on the CPU: replays by calling the eager module."""

    def __init__(self, module, arguments):
        self.module, self.arguments = module, arguments

    def replay(self, greedy: bool, fresh: bool = False):
        return self.module(*self.arguments)


@pytest.fixture(scope="module")
def model():
    return build_runtime(open_fixture()).model


def implementations(model) -> list:
    from helios.runtime.loading.model import program_arguments

    packer = Packer(model.prepared, model.buffers, max(1, model.prepared.state_rows_per_request()))
    eager = Executor(model, packer, program_table(model))
    captured = dataclasses.replace(model, programs=tuple(
        dataclasses.replace(p, module=Replayed(p.module, program_arguments(p, model.weights, model.buffers)))
        for p in model.programs))
    graphs = executor_for(captured, packer)
    ranked = RankedExecutor(eager, SimpleNamespace(device_group=None), WorkerStats())
    return [eager, graphs, ranked]


def test_every_executor_satisfies_the_protocol(model):
    executors = implementations(model)
    assert [type(e) for e in executors] == [Executor, GraphExecutor, RankedExecutor]
    for executor in executors:
        assert isinstance(executor, PlanExecutor), type(executor).__name__
        alone = inspect.signature(type(executor).launch).parameters["alone"]
        assert alone.kind is inspect.Parameter.KEYWORD_ONLY and alone.default is False
        assert executor.overlaps is False and executor.images is None  # the CPU fixture: text only


def test_the_eager_and_graph_executors_run_a_plan_alike(model):
    eager, graphs, _ = implementations(model)
    scheduler = Scheduler.create(capacities_of(model))
    scheduler.submit(spec("r", (5, 6, 7), 2))
    plan = scheduler.schedule()
    first = run(eager, plan).results
    assert run(graphs, plan._replace(admitted=())).results == first  # the packer already holds "r"


def capacities_of(model):
    from helios.runtime.execution.geometry import capacities_for

    return capacities_for(model, 16, 0)


def test_a_graph_executor_refuses_programs_that_were_not_captured(model):
    packer = Packer(model.prepared, model.buffers, 1)
    with pytest.raises(CaptureError, match="not captured"):
        GraphExecutor(model, packer, program_table(model))
    assert type(executor_for(model, packer)) is Executor


class ProtocolOnly:
    """Nothing but `PlanExecutor` (slots: no other attribute exists to be probed), over the fake
    model; records the `alone` flag of every launch."""

    __slots__ = ("model", "images", "_fake", "alone")

    def __init__(self, caps):
        vocabulary = SimpleNamespace(mask_words=4)
        self.model = SimpleNamespace(prepared=SimpleNamespace(contract=SimpleNamespace(
            model=SimpleNamespace(vocabulary=vocabulary))))
        self.images = None
        self._fake = FakeExecutor(caps)
        self.alone: list[bool] = []

    @property
    def overlaps(self) -> bool:
        return False

    def launch(self, plan, *, alone: bool = False):
        self.alone.append(alone)
        return tuple(self._fake.run(plan))

    def finish(self, handle) -> StepOutput:
        return StepOutput(handle, {})


@pytest.mark.parametrize("frames", [1, 2])
def test_the_engine_drives_an_executor_through_the_protocol_alone(frames):
    caps = capacities()
    executor = ProtocolOnly(caps)
    assert isinstance(executor, PlanExecutor)
    engine = Engine(Scheduler.create(caps), executor, frames=frames)
    tokens: dict[str, list[int]] = {}
    ends: dict[str, FinishEvent] = {}

    def on_event(event):
        if isinstance(event, TokenEvent):
            tokens.setdefault(event.request_id, []).extend(event.token_ids)
        else:
            ends[event.request_id] = event

    prompts = {f"r{i}": tuple(range(3 + i, 12 + 2 * i)) for i in range(5)}
    for request_id, prompt in prompts.items():
        engine.submit(EngineRequest(spec(request_id, prompt, 6), on_event))
    engine.run_until_idle()
    assert all(end.reason is FinishReason.LENGTH for end in ends.values()) and len(ends) == 5
    assert tokens == {rid: reference(prompt, 6) for rid, prompt in prompts.items()}
    assert set(executor.alone) == {frames == 1}
    assert engine.stats.second_frames == 0 or frames == 2

"""Synchronous driving (`Engine.run_until_idle`, offline generation) runs a long workload to its end
and stops only an engine that stalls.

Before, `run_until_idle` gave up after a fixed number of steps however busy they were: an offline
batch needing more rounds (a million: 2,000 prompts of 500 tokens on a core of one decode row)
ended in "the engine did not go idle" after all its work, every result lost. The bound is now on
steps in a row that run no plan; the tests use a small one for the same behaviour."""

from __future__ import annotations

import pytest

from helios.errors import ExecutionError
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import build_runtime

from .test_model_fixture import EXPECTED, open_fixture


def test_a_workload_of_more_rounds_than_the_stall_bound_runs_to_its_end():
    engine = build_runtime(open_fixture()).engine
    events = []
    for index, prompt in enumerate(EXPECTED["prompts"]):
        engine.submit(EngineRequest(RequestSpec(f"r{index}", tuple(prompt), EXPECTED["max_tokens"]), events.append))
    engine.run_until_idle(3)  # a dozen rounds, three of them a bound only on rounds that do nothing
    finished = [e for e in events if isinstance(e, FinishEvent)]
    assert sorted(e.request_id for e in finished) == ["r0", "r1", "r2"]
    assert {e.reason.name for e in finished} == {"LENGTH"}
    assert not engine.has_pending


def test_an_engine_whose_scheduler_plans_nothing_stops_with_a_typed_error():
    engine = build_runtime(open_fixture()).engine
    engine.submit(EngineRequest(RequestSpec("stuck", (5, 6, 7), 4), lambda event: None))
    engine.scheduler.schedule = lambda: None  # work queued that no plan ever takes
    with pytest.raises(ExecutionError, match="did not go idle"):
        engine.run_until_idle(50)

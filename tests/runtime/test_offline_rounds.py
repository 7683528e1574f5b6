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


def test_a_run_stopped_part_way_keeps_its_outputs_in_the_holder_it_was_given():
    """`helios generate` kept a submit loop of its own beside `offline.generate`'s so that Ctrl-C kept
    the outputs so far; `generate` now fills an `OfflineOutputs` its caller holds: the same outputs
    as a whole run's up to the stop, an unfinished prompt's tokens so far CANCELLED."""
    from helios.runtime.offline import OfflineOutputs, generate

    prompts, max_tokens = EXPECTED["prompts"], EXPECTED["max_tokens"]
    engine = build_runtime(open_fixture()).engine
    whole = generate(engine, prompts, max_tokens, outputs=(given := OfflineOutputs(prompts)))
    assert [list(r.token_ids) for r in whole] == EXPECTED["token_ids"] and given.generations() == whole

    engine = build_runtime(open_fixture()).engine
    real_step, steps = engine.step, []

    def step():
        steps.append(1)
        if len(steps) == 4:
            raise KeyboardInterrupt
        return real_step()

    engine.step = step
    outputs = OfflineOutputs(prompts)
    with pytest.raises(KeyboardInterrupt):
        generate(engine, prompts, max_tokens, outputs=outputs)
    cut = outputs.generations()
    assert any(r.token_ids for r in cut) and all(r.finish_reason.name == "CANCELLED" for r in cut)
    for result, expected, prompt in zip(cut, EXPECTED["token_ids"], prompts):
        assert list(result.token_ids) == expected[:len(result.token_ids)] and len(result.token_ids) < len(expected)
        assert (result.num_prompt_tokens, result.message) == (len(prompt), "interrupted before it finished")
    with pytest.raises(ValueError, match="outputs for 1 prompts given for 3 prompts"):
        generate(engine, prompts, max_tokens, outputs=OfflineOutputs(prompts[:1]))

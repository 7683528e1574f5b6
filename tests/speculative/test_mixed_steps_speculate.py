"""Session 70's hunt: speculation combined with the scheduler's MIXED steps.

A MIXED step is chosen whenever decoding lanes run and a waiting request could take a free slot;
when that head cannot be admitted (too few pages until a running request ends), the step held the
decoding lanes alone and ran them as a plain DECODE step, one token a lane, on a core that would
have speculated for them: on the rig below 29 of 45 steps were such plain steps (without MIXED
programs, where prompt and decode steps alternate, the lanes speculated at once). Such a step now
runs SPECULATIVE, with the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.contract import StartupOptions
from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint

from .support import eager_model, eager_runtime, truncated

UNUSED = Path("draft-is-given-directly")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3_UNTIED), tmp_path_factory.mktemp("llama3_untied")))


def run(recipe, speculative: bool):
    """Three decoding requests and a long prompt behind them that the 24 pages cannot admit while
    they grow: (each request's tokens and finish, [(operation, whether its step preempted)])."""
    plan = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=16, decode_batches=(4,), mixed=True,
                        speculative=SpeculativePlan(UNUSED, widths=(4,)))
    model = eager_model(recipe, truncated(recipe, 1), plan, StartupOptions(), num_pages=24)
    engine, _ = eager_runtime(model, SchedulerPolicy(speculative=speculative))
    steps, launch, builder = [], engine.executor.launch, engine.scheduler.builder
    preemptions = [0]

    def recorded(plan, **kwargs):
        steps.append((plan.operation.name, builder.num_preemptions > preemptions[0]))
        preemptions[0] = builder.num_preemptions
        return launch(plan, **kwargs)

    engine.executor.launch = recorded
    out: dict[str, list] = {}

    def on_event(event) -> None:
        entry = out.setdefault(event.request_id, [[], None])
        if isinstance(event, TokenEvent):
            entry[0].extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            entry[1] = (event.reason.name, event.num_output_tokens)

    for index in range(3):
        engine.submit(EngineRequest(RequestSpec(f"r{index}", tuple(range(1 + index, 9 + index)), 40), on_event))
    engine.submit(EngineRequest(RequestSpec("long", tuple(range(20, 60)), 8), on_event))
    engine.run_until_idle()
    return out, steps


def test_a_mixed_step_that_admits_nothing_speculates(llama):
    expected, _ = run(llama, speculative=False)
    got, steps = run(llama, speculative=True)
    assert got == expected
    assert ("MIXED", False) in steps and ("SPECULATIVE", False) in steps
    # a plain step only where the step preempted (its victim's pages went to the MIXED rows)
    assert [step for step in steps if step[0] == "DECODE" and not step[1]] == []

"""RESUME programs: a prompt-only step holding a lane that continues from a nonzero committed endpoint
at its slot generation's first row (a prefix-cache or snapshot restore, a readmission after
preemption) runs the core's RESUME program; fresh prompts, decode rounds and lanes RESUME programs
do not serve run the other programs; tokens are the same either way."""

from __future__ import annotations

import dataclasses

from helios.runtime.records.capacities import Operation
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import FakeExecutor, reference
from .harness import Driver, assert_all_released, capacities, make, spec

PROMPT = list(range(1, 14))


def operations(driver, request_id: str) -> list[Operation]:
    return [plan.operation for plan in driver.plans if any(row.request_id == request_id for row in plan.rows)]


def test_a_prefix_hit_resumes_and_a_fresh_prompt_prefills():
    scheduler, driver = make(max_active=4, num_pages=32, resume=True, mixed=False)
    driver.submit(spec("a", PROMPT, 2))
    driver.run()
    assert operations(driver, "a")[0] == Operation.PREFILL  # from endpoint 0: nothing to resume
    driver.submit(spec("b", PROMPT[:12] + [50, 51, 52], 3))
    driver.run()
    first = next(plan for plan in driver.plans if plan.rows and plan.rows[0].request_id == "b")
    assert first.operation == Operation.RESUME and first.variant.operation == Operation.RESUME
    assert first.rows[0].admits and first.rows[0].start_pos == 12
    assert operations(driver, "b")[1:] == [Operation.DECODE, Operation.DECODE]
    assert driver.outcomes["b"].tokens == reference(PROMPT[:12] + [50, 51, 52], 3)
    assert_all_released(scheduler)


def test_without_a_resume_program_the_same_step_prefills():
    scheduler, driver = make(max_active=4, num_pages=32, mixed=False)
    driver.submit(spec("a", PROMPT, 2))
    driver.run()
    driver.submit(spec("b", PROMPT[:12] + [50, 51, 52], 3))
    driver.run()
    assert operations(driver, "b")[0] == Operation.PREFILL
    assert driver.outcomes["b"].tokens == reference(PROMPT[:12] + [50, 51, 52], 3)


def test_lanes_asking_for_log_probabilities_prefill():
    caps = dataclasses.replace(capacities(max_active=4, num_pages=32, resume=True, mixed=False), token_logprobs=2)
    scheduler = Scheduler.create(caps, SchedulerPolicy(), clock=iter(range(10**9)).__next__)
    driver = Driver(scheduler, FakeExecutor(caps))
    driver.submit(spec("a", PROMPT, 2))
    driver.run()
    driver.submit(spec("b", PROMPT[:12] + [50, 51, 52], 3, top_logprobs=2))
    driver.run()
    assert operations(driver, "b")[0] == Operation.PREFILL  # RESUME programs have no token-logprobs twin


def test_readmission_after_offload_preemption_resumes():
    scheduler, driver = make(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD), max_active=4, num_pages=9,
                             resume=True, mixed=False)
    prompts = {"a": list(range(1, 9)), "b": list(range(20, 26)), "c": list(range(40, 46))}
    driver.submit(*(spec(name, prompt, 12) for name, prompt in prompts.items()))
    driver.run()
    assert scheduler.counters().preemptions > 0
    # A readmitted lane with only its pending token left decodes (DECODE programs admit slots); one
    # in a prompt step resumes.
    readmitted = [plan for plan in driver.plans for row in plan.rows if row.admits and row.start_pos > 0]
    assert readmitted and all(plan.operation in (Operation.RESUME, Operation.DECODE) for plan in readmitted)
    assert any(plan.operation == Operation.RESUME for plan in readmitted)
    for name, prompt in prompts.items():
        assert driver.outcomes[name].tokens == reference(prompt, 12)
    assert_all_released(scheduler)

"""Session 71's scheduler hunt on the fake executor.

A core without DECODE programs whose SPECULATIVE programs are narrower than the decode cohort (the
scheduler decodes through MIXED programs there): the widest SPECULATIVE program took the first lanes
in scheduling order round after round, each until it ended, and the others got no token meanwhile
(six lanes beside two-row programs: the last two waited nine decoding steps for their second token,
and the cohort took 14 decoding steps where plain decoding takes 9). Such a cohort now decodes plainly,
every lane a step, as it does where DECODE programs are loaded.
"""

from __future__ import annotations

import dataclasses

from helios.runtime.records.capacities import Operation
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import FakeExecutor, reference
from .harness import Driver, assert_all_released, capacities, spec

PROMPTS = [[index + 1, 2, 3] for index in range(6)]
MAX_OUTPUT = 10


def without_decode_narrow_speculation():
    """Six active lanes; MIXED and PREFILL programs, no DECODE, SPECULATIVE programs of two rows."""
    caps = capacities(max_active=6, mixed=True, speculative=(2, 3))
    narrow = tuple(dataclasses.replace(v, batch_capacity=2, packed_token_capacity=6)
                   if v.operation == Operation.SPECULATIVE else v
                   for v in caps.variants if v.operation != Operation.DECODE)
    caps = dataclasses.replace(caps, variants=narrow)
    scheduler = Scheduler.create(caps, SchedulerPolicy(), clock=iter(range(10**9)).__next__)
    return scheduler, Driver(scheduler, FakeExecutor(caps))


def test_a_cohort_wider_than_the_speculative_programs_decodes_every_lane_without_decode_programs():
    scheduler, driver = without_decode_narrow_speculation()
    driver.submit(*(spec(f"r{index}", prompt, MAX_OUTPUT) for index, prompt in enumerate(PROMPTS)))
    outcomes = driver.run()
    for index, prompt in enumerate(PROMPTS):
        assert outcomes[f"r{index}"].tokens == reference(prompt, MAX_OUTPUT)
    assert_all_released(scheduler)
    (prefill, *decoding) = driver.plans  # one prompt step holds every prompt
    assert len(prefill.rows) == len(PROMPTS)
    steps = [(plan.operation.name, [row.request_id for row in plan.rows]) for plan in driver.plans]
    for plan in decoding:  # no lane waits while others decode: every step holds all six
        assert len(plan.rows) == len(PROMPTS), steps
    assert len(decoding) == MAX_OUTPUT - 1

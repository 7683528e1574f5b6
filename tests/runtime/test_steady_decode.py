"""The steady decode step (`helios.runtime.scheduling.steady`) composes exactly the plans of the
general path: two schedulers, one with `StepBuilder.steady` off, run the same scripted workloads in
lockstep (rows finishing mid-cohort by EOS and by length, cancellations, host stops, admissions
joining a running cohort, preemption with recompute and offload, sliding windows, recurrent state,
two frames) and must produce equal plans, events and final states, while the steady path does
run (and falls back) along the way."""

from __future__ import annotations

import random

import pytest

from helios.runtime.records.events import FinishReason
from helios.runtime.scheduling import steps
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import VOCAB, reference
from .harness import Driver, assert_all_released, make, spec
from .test_window_region import make as make_window


class Counted:
    """Counts the steady path's outcomes (True: a steady step composed, False: fell back)."""

    def __init__(self, inner):
        self.inner = inner
        self.composed = 0
        self.fallbacks = 0

    def __call__(self, builder, draft):
        composed = self.inner(builder, draft)
        self.composed += composed
        self.fallbacks += not composed
        return composed


def script(seed: int, num_requests: int) -> dict[int, list[tuple]]:
    """Step index -> actions: submissions (some at once, some joining later), cancellations, stops."""
    rng = random.Random(seed)
    actions: dict[int, list[tuple]] = {}
    for index in range(num_requests):
        at = 0 if index < num_requests // 2 else rng.randrange(1, 40)
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 14))]
        eos = frozenset(rng.sample(range(VOCAB), 3)) if rng.random() < 0.4 else frozenset()
        request = spec(f"r{index}", prompt, rng.randrange(1, 16), eos_ids=eos, observe=index % 3 == 1)
        actions.setdefault(at, []).append(("submit", request))
    for index in rng.sample(range(num_requests), 3):
        actions.setdefault(rng.randrange(2, 60), []).append((rng.choice(("cancel", "stop")), f"r{index}"))
    return actions


def lockstep(seed: int, policy: SchedulerPolicy, num_requests: int = 10, maker=make,
             **options) -> tuple[Driver, Driver]:
    """Runs the script on a steady and a general scheduler, comparing every plan and event."""
    pairs = [maker(policy, **options) for _ in range(2)]
    pairs[1][0].builder.steady = False
    pairs[1][0].plain_completion = False  # the general side applies completions row by row
    drivers = [driver for _, driver in pairs]
    actions = script(seed, num_requests)
    for index in range(100_000):
        for kind, argument in actions.get(index, ()):
            for driver in drivers:
                if kind == "submit":
                    driver.submit(argument)
                elif argument in driver.outcomes:
                    getattr(driver, kind)(argument)
        busy = [driver.step() for driver in drivers]
        assert busy[0] == busy[1]
        assert drivers[0].plans == drivers[1].plans, f"seed {seed}: plan {len(drivers[0].plans) - 1} differs"
        if not busy[0] and index > max(actions):
            break
    steady, general = drivers
    assert {k: (o.tokens, o.finish, o.token_events) for k, o in steady.outcomes.items()} == \
        {k: (o.tokens, o.finish, o.token_events) for k, o in general.outcomes.items()}
    for _, driver in pairs:
        assert_all_released(driver.scheduler)
    assert steady.scheduler.counters() == general.scheduler.counters()
    return steady, general


POLICIES = {
    "recompute": (SchedulerPolicy(two_frames=False), {}),
    "offload": (SchedulerPolicy(PreemptionMode.OFFLOAD, two_frames=False), {}),
    "two-frames": (SchedulerPolicy(), {}),
    "no-prefix-cache": (SchedulerPolicy(prefix_caching=False, two_frames=False), {}),
    "window": (SchedulerPolicy(two_frames=False), {"window": 8}),
    "stateful": (SchedulerPolicy(two_frames=False), {"stateful": True}),
    # Published state snapshots move to the host below the watermark (a recurrent layout has them).
    "watermark": (SchedulerPolicy(two_frames=False, offload_watermark_pages=10), {"stateful": True}),
    # A window region with its own page ids beside the full one (gpt-oss's layers): window tables.
    "window-region": (SchedulerPolicy(prefix_caching=False, two_frames=False),
                      {"maker": make_window, "num_window_pages": 10}),
    # Second frames over a window region (their rows carry window table entries too).
    "window-region-two-frames": (SchedulerPolicy(prefix_caching=False),
                                 {"maker": make_window, "num_window_pages": 10}),
}


@pytest.mark.parametrize("name", POLICIES)
def test_steady_steps_equal_the_general_path(name, monkeypatch):
    counted = Counted(steps.steady_decode)
    monkeypatch.setattr(steps, "steady_decode", counted)
    seconds = []  # second frames built the lean way (the steady side only)
    second = steps.steady_second
    monkeypatch.setattr(steps, "steady_second", lambda *args: seconds.append(second(*args)) or seconds[-1])
    plain = []  # rows of the completions applied in the lean pass (the steady side only)
    inner = Scheduler._complete_plain
    monkeypatch.setattr(Scheduler, "_complete_plain", lambda self, rows, *rest: (
        plain.append(len(rows)), inner(self, rows, *rest))[1])
    policy, options = POLICIES[name]
    for seed in range(6):
        # Few pages (preemption), fewer slots than requests (a queue behind a full cohort).
        sizes = {"max_active": 4, "num_pages": 14} | ({} if "maker" in options else {"page_tokens": 4})
        lockstep(seed, policy, **sizes, **options)
    # With two frames a decode cohort mostly runs as second frames; fresh steps between are few.
    assert counted.composed > (1 if policy.two_frames else 20), (counted.composed, counted.fallbacks)
    assert counted.fallbacks > 5, (counted.composed, counted.fallbacks)
    assert len(plain) > 20 and max(plain) > 1, plain
    if policy.two_frames:
        assert sum(seconds) > 20, seconds


def test_steady_rows_finish_mid_cohort_with_the_reference_tokens(monkeypatch):
    """A cohort of four whose rows end at different steps (length and EOS); the survivors' steps
    stay steady after each departure, and every request's tokens are the reference's."""
    counted = Counted(steps.steady_decode)
    monkeypatch.setattr(steps, "steady_decode", counted)
    scheduler, driver = make(SchedulerPolicy(two_frames=False), max_active=4, num_pages=64)
    prompts = {f"r{i}": [3 + i, 5, 7 + 2 * i] for i in range(4)}
    eos = frozenset(reference(prompts["r3"], 9)[5:6])  # r3 meets its EOS at its sixth token
    for index, (name, prompt) in enumerate(prompts.items()):
        driver.submit(spec(name, prompt, 4 + 3 * index, eos_ids=eos if name == "r3" else frozenset()))
    outcomes = driver.run()
    for index, (name, prompt) in enumerate(prompts.items()):
        expected = reference(prompt, 4 + 3 * index, eos if name == "r3" else frozenset())
        assert outcomes[name].tokens == expected
    assert outcomes["r3"].finish.reason is FinishReason.EOS and len(outcomes["r3"].tokens) == 6
    assert outcomes["r0"].finish.reason is FinishReason.LENGTH
    decode_plans = [p for p in driver.plans if p.operation.name == "DECODE"]
    assert [len(p.rows) for p in decode_plans][-2:] == [1, 1]  # the last survivor decodes alone
    assert counted.composed >= len(decode_plans) - 4  # each departure costs at most one general step
    assert_all_released(scheduler)

"""Seeded stress runs of the engine against a model of its output (`tests/runtime/stress.py`).

Each scenario drives random arrivals (shared prefixes, choices of one prompt, output limits down to
one, EOS ids, stop sequences, frontend stops, grammars, log-probabilities, logit biases, prompt
scores, reused ids), cancellations aimed at every phase and failing hooks and plans through an
engine over a small page pool, and checks every request's tokens and end against the same request
run alone, then that the idle engine holds nothing. The scenarios differ in what the engine runs:
speculation (a truncated draft, the target as draft, history drafting, device allocation),
preemption by recompute or offload, one or two execution frames, a sliding window (Mistral), a
window region of its own pages (gpt-oss), recurrent state with snapshots and later turns (Bamba),
seeded sampling.

The engine reports a request whose own `on_event` raised at the token that ended it (its output
limit or EOS) with 0 output tokens (`Engine._fail_request` finds no finish to take its counts from);
`stress._check_request` accepts that one count until the engine takes it from the round's events.
"""

from __future__ import annotations

import pytest

from helios.ignition.recipes import load_checkpoint
from helios.runtime.records.events import FinishReason
from helios.runtime.scheduling.policy import PreemptionMode
from ignition.hf_checkpoints import BAMBA, GPT_OSS, LLAMA3_UNTIED, MISTRAL, random_model, write_checkpoint
from support.sweeps import swept

from .stress import INGRESS, Scenario, StressRun

OFFLOAD = PreemptionMode.OFFLOAD
FAMILIES = {"llama3": LLAMA3_UNTIED, "mistral": MISTRAL, "gpt_oss": GPT_OSS, "bamba": BAMBA}
SCENARIOS = {
    "truncated-draft-faults": Scenario(seed=3, faults=0.03),
    "self-draft-history-offload": Scenario(seed=1, draft="self", history_drafting=True, preemption=OFFLOAD,
                                           host_pages=24),
    "two-frames-offload-logprobs-sampled": Scenario(seed=2, draft="none", frames=2, preemption=OFFLOAD, host_pages=24,
                                                    logprobs=0.3, sampled=0.3),
    "sliding-window": Scenario(seed=2, family="mistral", draft="none", frames=2, sampled=0.2),  # no preemption
    "window-pages-offload": Scenario(seed=1, family="gpt_oss", draft="none", frames=2, preemption=OFFLOAD,
                                     host_pages=24, sampled=0.2),
    "device-allocation-snapshots-scores": Scenario(seed=1, width=3, per_lane=2, allocate=True, draft_tokens=5,
                                                   snapshots=0.3, scored=0.1),
    "recurrent-snapshots-turns": Scenario(seed=1, family="bamba", draft="none", frames=2, preemption=OFFLOAD,
                                          host_pages=24, snapshots=0.2, turns=0.3, faults=0.02),
}
# With HELIOS_STRESS_SWEEP=1 (or HELIOS_FULL_SUITE=1) also history drafting beside two frames and faults: by
# default self-draft-history-offload drafts from the history, test_stress_on_the_worker_thread_through_a_shutdown
# speculates (a truncated draft) with two frames and faults, truncated-draft-faults fails plans.
if swept("HELIOS_STRESS_SWEEP"):
    SCENARIOS["history-two-frames-faults"] = Scenario(seed=1, history_drafting=True, frames=2, num_pages=18,
                                                      faults=0.03)


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            directory = write_checkpoint(random_model(FAMILIES[name]), tmp_path_factory.mktemp(name))
            cache[name] = load_checkpoint(directory)
        return cache[name]

    return get


@pytest.mark.parametrize("name", SCENARIOS)
def test_stress(recipes, name):
    scenario = SCENARIOS[name]
    run = StressRun(scenario, recipes(scenario.family))
    run.run()
    reasons = run.check()
    # What the scenario is for happened. A sliding window holds few pages: nothing is preempted.
    # Choices share a prompt's pages only where pages hold the whole state and no window region has
    # pages of its own (gpt-oss: window pages; Bamba: recurrent state, reused through snapshots).
    counters = run.engine.scheduler.counters()
    assert counters.prefix_reused_tokens > 0 and (counters.preemptions > 0) == (scenario.family != "mistral"), counters
    assert reasons[FinishReason.LENGTH] and reasons[FinishReason.CANCELLED], reasons
    assert sum(run.cancels_sent.values()) - run.cancels_sent["ended"] >= 3, run.cancels_sent
    assert (run.operations["SPECULATIVE"] > 0) == (scenario.draft != "none"), run.operations
    shares = run.engine.scheduler.cache.groups.num_shared_admissions > 0
    assert shares == (scenario.family in ("llama3", "mistral"))


def test_stress_on_the_worker_thread_through_a_shutdown(recipes):
    run = StressRun(Scenario(seed=7, frames=2, num_requests=40, faults=0.02), recipes("llama3"))
    run.run_threaded(ended_before_shutdown=12)
    reasons = run.check()
    assert reasons[FinishReason.CANCELLED] > run.cancels_sent[INGRESS], reasons  # the shutdown ended some

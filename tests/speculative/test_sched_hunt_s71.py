"""Session 71's scheduler hunt: speculation beside requests that cannot speculate.

A request asking for log-probabilities (or with a logit bias) decodes through plain programs, and
so, while it decodes, does every lane beside it (speculative programs return no log-probabilities).
While such a request was still computing a long prompt, chunked over several prompt steps, no lane
of it decoded at all, yet every decode step between its chunks ran plain too: the decoding lanes
speculate there now, and the request's tokens and log-probabilities are those of a plain run.

(Once it decodes, its lanes could run plain steps of their own between speculative rounds of the
others, but each of its tokens would then take two steps: six lanes of 24 tokens, one asking for
log-probabilities, took 23 plain decode steps; alternating would take about 47 for it.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA2, random_model, write_checkpoint
from runtime.stress import stress_engine, stress_model

from .support import truncated

UNUSED = Path("draft-is-given-directly")
DECODING = RequestSpec("decoding", (5, 17, 3, 9), 24)
# 40 prompt tokens in chunks of 8 (the first beside the other prompt): a decode step between chunks
SCORED = RequestSpec("scored", tuple(range(20, 60)), 3, top_logprobs=2)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA2, 1), tmp_path_factory.mktemp("llama2")))


def run(recipe, speculative: bool):
    """(each request's tokens, the scored one's log-probabilities, each step's (operation, request ids,
    whether the scored request samples))."""
    plan = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=8, decode_batches=(1, 2), mixed=False,
                        speculative=SpeculativePlan(UNUSED, widths=(4,)))
    engine = stress_engine(stress_model(recipe, truncated(recipe, 1), plan), SchedulerPolicy(speculative=speculative))
    steps, launch = [], engine.executor.launch

    def recorded(plan, **kwargs):
        scored = any(row.request_id == SCORED.request_id and row.samples for row in plan.rows)
        steps.append((plan.operation.name, tuple(row.request_id for row in plan.rows), scored))
        return launch(plan, **kwargs)

    engine.executor.launch = recorded
    tokens: dict[str, list[int]] = {}
    logprobs = []

    def on_event(event) -> None:
        if isinstance(event, TokenEvent):
            tokens.setdefault(event.request_id, []).extend(event.token_ids)
            if event.request_id == SCORED.request_id:
                logprobs.extend(event.logprobs)

    engine.submit(EngineRequest(DECODING, on_event))
    engine.submit(EngineRequest(SCORED, on_event))
    engine.run_until_idle()
    return tokens, logprobs, steps


def test_decoding_lanes_speculate_while_a_logprobs_request_computes_its_prompt(recipe):
    expected, expected_logprobs, _ = run(recipe, speculative=False)
    got, logprobs, steps = run(recipe, speculative=True)
    assert got == expected
    assert len(logprobs) == SCORED.max_output_tokens
    for one, other in zip(logprobs, expected_logprobs):
        assert one.logprob == pytest.approx(other.logprob, abs=1e-4)
        assert [token for token, _ in one.top] == [token for token, _ in other.top]
    # the decode steps between the scored request's prompt chunks (before its first token) speculate
    first_sampled = next(index for index, (_, _, scored) in enumerate(steps) if scored)
    between = [operation for operation, _, _ in steps[:first_sampled] if operation != "PREFILL"]
    assert len(between) >= 4 and set(between) == {"SPECULATIVE"}, steps

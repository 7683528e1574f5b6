"""A grammar dead end in the plans that speculate and preempt (`helios.runtime.feedback`): the
request ends GRAMMAR_DEAD_END with exactly the tokens its grammar took, and the requests beside it,
speculating in the same plans (drafts and verify rows), keep their outputs alone.

A constrained request is single-lane: in a SPECULATIVE plan its row samples one token under its
mask while the other lanes draft and verify. The row whose mask found the dead end still runs (its
token is the one the error mask forces) and must be dropped at completion, as must the rows of a
plan launched before the end; nothing of it may reach the request's events or its neighbours'
lanes."""

from __future__ import annotations

import pytest

from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import EngineRequest
from helios.runtime.feedback import TensorGrammar
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint
from support.scripted_grammar import EOS, ScriptedMatcher, tokens_of

from .stress import capacity_plan, run_alone, stress_engine, stress_model, truncated


def dead_end_after(num_fine: int) -> ScriptedMatcher:
    """Allows every token but EOS until `num_fine` were consumed; the next mask finds a dead end
    (llguidance's sticky error state: the mask then allows only EOS)."""
    return ScriptedMatcher(num_fine, "NoExtension", on_fill=True, allows_eos=False)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3_UNTIED), tmp_path_factory.mktemp("llama3")))


def speculating_engine(recipe, num_pages: int | None):
    """A stress engine of `recipe` whose lanes speculate (a one-layer draft, four slots; `num_pages`:
    a pool small enough to preempt, or None for pages to spare), and the plans it launches, in order."""
    engine = stress_engine(stress_model(recipe, truncated(recipe, 1), capacity_plan(4), num_pages=num_pages),
                           SchedulerPolicy())
    plans = []
    launch = engine.executor.launch
    engine.executor.launch = lambda plan, **kw: plans.append(plan) or launch(plan, **kw)
    return engine, plans


def events_of(engine, requests):
    """Submits (spec, grammar) pairs and runs the engine idle; the events of each, by request id."""
    events = {spec.request_id: [] for spec, _ in requests}
    for spec, grammar in requests:
        engine.submit(EngineRequest(spec, events[spec.request_id].append, grammar=grammar))
    engine.run_until_idle()
    return events


def events_beside_plain(engine, recipe, plain, constrained):
    """`events_of` the `plain` specs beside the `constrained` (spec, grammar) pairs, after checking that
    every plain request produced what it produces alone and ended by length or EOS."""
    events = events_of(engine, [(spec, None) for spec in plain] + constrained)
    for spec in plain:
        finish = events[spec.request_id][-1]
        assert tokens_of(events[spec.request_id]) == run_alone(recipe, spec).tokens[:finish.num_output_tokens]
        assert finish.reason in (FinishReason.LENGTH, FinishReason.EOS)
    return events


@pytest.mark.parametrize("num_pages", [None, 18], ids=["pages-to-spare", "preempting"])
def test_a_dead_end_beside_speculating_lanes_drops_its_forced_token_and_touches_none(recipe, num_pages):
    engine, plans = speculating_engine(recipe, num_pages)
    plain = [RequestSpec(f"p{i}", tuple(range(5 + i, 25 + i)), 14, frozenset({EOS})) for i in range(3)]
    matchers = {f"g{k}": dead_end_after(k) for k in (0, 1, 6)}
    constrained = [(RequestSpec(name, tuple(range(40, 52)), 14, frozenset({EOS}), constrained=True),
                    TensorGrammar(matcher)) for name, matcher in matchers.items()]
    events = events_beside_plain(engine, recipe, plain, constrained)
    for name, matcher in matchers.items():
        finishes = [e for e in events[name] if isinstance(e, FinishEvent)]
        assert [f.reason for f in finishes] == [FinishReason.GRAMMAR_DEAD_END], finishes
        assert tokens_of(events[name]) == matcher.consumed and len(matcher.consumed) == matcher.num_fine
        assert finishes[0].num_output_tokens == matcher.num_fine and events[name][-1] is finishes[0]
    assert any(p.operation == Operation.SPECULATIVE and {r.request_id for r in p.rows} & set(matchers)
               for p in plans), [p.operation for p in plans]
    counters = engine.scheduler.counters()
    assert (counters.preemptions > 0) == (num_pages is not None), counters
    assert counters.num_running == counters.num_waiting == 0 and not engine.feedback.watching
    assert engine.stats.requests_finished["grammar_dead_end"] == 3 and engine.stats.healthy

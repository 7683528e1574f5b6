"""The engine's message boundary: per-round `StepBatch` records to a sink, stop-matched commands.

Driven synchronously (`run_until_idle`) on the committed fixture core, so every round is this
thread's: the sink sees exactly what the worker emits, in order.
"""

from __future__ import annotations

import pytest

from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.outlet import StepBatch
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import build_runtime

from .test_model_fixture import open_fixture

PROMPT = (5, 9, 14, 3, 22, 7)


def request(request_id: str, max_tokens: int, on_event=None, **spec) -> EngineRequest:
    return EngineRequest(RequestSpec(request_id, PROMPT, max_tokens, **spec), on_event)


@pytest.fixture
def engine():
    return build_runtime(open_fixture()).engine


def tokens_of(events, request_id: str) -> list[int]:
    return [t for e in events if isinstance(e, TokenEvent) and e.request_id == request_id for t in e.token_ids]


def test_sink_requests_get_one_batch_per_round_and_on_event_requests_stay_inline(engine):
    batches: list[StepBatch] = []
    inline = []
    engine.connect(batches.append)
    engine.submit(request("a", 5))
    engine.submit(request("b", 3))
    engine.submit(request("c", 5, inline.append))
    engine.run_until_idle()

    events = [e for batch in batches for e in batch.events]
    assert all(batch.events for batch in batches)
    assert {e.request_id for e in events} == {"a", "b"}  # an on_event request never reaches the sink
    for request_id, limit in (("a", 5), ("b", 3)):
        own = [e for e in events if e.request_id == request_id]
        assert isinstance(own[-1], FinishEvent) and own[-1].reason is FinishReason.LENGTH
        assert sum(isinstance(e, FinishEvent) for e in own) == 1
        assert len(tokens_of(own, request_id)) == limit
    assert tokens_of(events, "a") == tokens_of(inline, "c")  # the same greedy tokens either way
    assert len(batches) <= engine.stats.generated_tokens  # batched per round, not per token
    assert engine.stats.generated_tokens == 5 + 3 + 5


def test_stop_matched_ends_the_request_with_the_frontend_count_and_drops_the_rest(engine):
    """A frontend that finds a stop after token 2 but says so only after token 4 (output work
    queued behind the worker): the request ends STOP with 2 output tokens, counted as 2."""
    batches: list[StepBatch] = []

    def sink(batch: StepBatch) -> None:
        batches.append(batch)
        seen = tokens_of([e for b in batches for e in b.events], "s")
        if len(seen) == 4:
            engine.stop_matched("s", 2)

    engine.connect(sink)
    engine.submit(request("s", 10, stop_strings=("zz",)))
    engine.run_until_idle()

    events = [e for b in batches for e in b.events]
    finish = events[-1]
    assert isinstance(finish, FinishEvent) and finish.reason is FinishReason.STOP
    assert finish.num_output_tokens == 2
    assert len(tokens_of(events, "s")) == 4  # the worker ran ahead of the frontend by two tokens
    assert engine.stats.generated_tokens == 2 and engine.stats.requests_finished["stop"] == 1
    assert engine.scheduler.counters().num_running == 0

    engine.stop_matched("s", 1)  # the request already ended: nothing happens
    engine.run_until_idle()
    assert [e for b in batches for e in b.events] == events


def test_a_stop_matched_after_the_end_changes_nothing(engine):
    batches: list[StepBatch] = []
    engine.connect(batches.append)
    engine.submit(request("s", 3, stop_strings=("zz",)))
    engine.run_until_idle()
    engine.stop_matched("s", 1)
    engine.run_until_idle()
    finishes = [e for b in batches for e in b.events if isinstance(e, FinishEvent)]
    assert [(f.reason, f.num_output_tokens) for f in finishes] == [(FinishReason.LENGTH, 3)]
    assert engine.stats.generated_tokens == 3


def test_a_request_without_on_event_needs_a_sink(engine):
    with pytest.raises(ValueError, match="no on_event"):
        engine.submit(request("x", 2))


def test_cancel_and_rejection_reach_the_sink(engine):
    batches: list[StepBatch] = []
    engine.connect(batches.append)
    engine.submit(request("too-long", 10**6))
    engine.submit(request("gone", 4))
    engine.cancel("gone")
    engine.run_until_idle()
    reasons = {e.request_id: e.reason for b in batches for e in b.events if isinstance(e, FinishEvent)}
    assert reasons == {"too-long": FinishReason.REJECTED, "gone": FinishReason.CANCELLED}


def test_tokens_reach_hooks_only_while_a_request_has_one(engine, monkeypatch):
    """Without a grammar or host stop anywhere, tokens are not fed to the feedback hooks (nothing
    could match); once a request has a host stop, every request's tokens are fed again and the
    stop ends its request as before."""
    fed = []
    advance = engine.feedback.advance
    monkeypatch.setattr(engine.feedback, "advance",
                        lambda request_id, ids: fed.append(request_id) or advance(request_id, ids))
    masks = []
    fill_masks = engine.feedback.fill_masks
    monkeypatch.setattr(engine.feedback, "fill_masks", lambda rows: masks.append(fill_masks(rows)) or masks[-1])
    plain = []
    engine.submit(request("plain", 4, plain.append))
    engine.run_until_idle()
    assert fed == [] and not engine.feedback.watching and masks and all(m == {} for m in masks)
    assert len(tokens_of(plain, "plain")) == 4
    seen = []
    stopped = []
    engine.submit(EngineRequest(RequestSpec("stopped", PROMPT, 6), stopped.append,
                                host_stop=lambda token: seen.append(token) or len(seen) == 2))
    engine.submit(request("beside", 3, plain.append))
    engine.run_until_idle()
    assert "stopped" in fed and "beside" in fed and not engine.feedback.watching  # forgotten at its end
    finish = [e for e in stopped if isinstance(e, FinishEvent)]
    assert len(finish) == 1 and finish[0].reason is FinishReason.STOP and seen == tokens_of(stopped, "stopped")[:2]


def test_a_token_hook_that_raises_ends_its_request_alone(engine):
    """A request's `on_event` that raises on its third token event: that request ends ERROR (its
    two tokens counted), the request beside it runs to its length with the same tokens as alone."""
    alone = []
    engine.submit(request("alone", 6, alone.append))
    engine.run_until_idle()
    generated = engine.stats.generated_tokens
    seen, beside = [], []

    def failing(event) -> None:
        seen.append(event)
        if isinstance(event, TokenEvent) and len(seen) == 3:
            raise RuntimeError("hook failed")
    engine.submit(request("failing", 6, failing))
    engine.submit(request("beside", 6, beside.append))
    engine.run_until_idle()
    finish = [e for e in seen if isinstance(e, FinishEvent)]
    assert len(finish) == 1 and finish[0].reason is FinishReason.ERROR and "hook failed" in finish[0].message
    assert len(tokens_of(seen, "failing")) == 3 and tokens_of(beside, "beside") == tokens_of(alone, "alone")
    assert beside[-1].reason is FinishReason.LENGTH
    assert engine.stats.generated_tokens == generated + 3 + 6 and engine.stats.requests_finished["error"] == 1



def test_a_hook_that_raises_at_the_last_token_ends_error_with_that_token_counted(engine):
    """The scheduler had already ended the request in that round (its finish was among the events
    being dispatched): the ERROR finish reported 0 output tokens after one was delivered."""
    seen = []

    def failing(event) -> None:
        seen.append(event)
        if isinstance(event, TokenEvent):
            raise RuntimeError("hook failed")
    engine.submit(request("last", 1, failing))
    engine.run_until_idle()
    finish = [e for e in seen if isinstance(e, FinishEvent)]
    assert len(tokens_of(seen, "last")) == 1 and len(finish) == 1 and finish[0].reason is FinishReason.ERROR
    assert finish[0].num_output_tokens == 1 and finish[0].num_prompt_tokens == len(PROMPT)


def test_run_until_idle_ends_requests_still_waiting_in_the_ingress_channel():
    """Queue capacity 1: a request cancelled before its round emptied the scheduler's queue while
    another waited in the ingress channel, and `run_until_idle` returned with that one never run."""
    from helios.runtime.service import RuntimeOptions

    engine = build_runtime(open_fixture(), RuntimeOptions(queue_capacity=1)).engine
    events = {"a": [], "b": [], "c": []}
    for name in events:
        engine.submit(request(name, 3, events[name].append))
    engine.cancel("a")
    engine.cancel("c")  # still in the ingress channel at its cancellation: counted as cancelled too
    engine.run_until_idle()
    assert engine.stats.requests_finished["cancelled"] == 2
    assert [e.reason for e in events["c"] if isinstance(e, FinishEvent)] == [FinishReason.CANCELLED]
    assert [e.reason for e in events["a"] if isinstance(e, FinishEvent)] == [FinishReason.CANCELLED]
    assert [e.reason for e in events["b"] if isinstance(e, FinishEvent)] == [FinishReason.LENGTH]
    assert len(tokens_of(events["b"], "b")) == 3


def test_requests_in_the_ingress_channel_count_as_queued():
    """A burst beyond the scheduler's queue capacity waits in the ingress channel: the queued gauge
    showed the scheduler's queue alone (2 of 10 requests waiting, permits held for all 10)."""
    from helios.runtime.service import RuntimeOptions

    engine = build_runtime(open_fixture(), RuntimeOptions(queue_capacity=1)).engine
    for name in "abc":
        engine.submit(request(name, 2, lambda event: None))
    engine.refresh_gauges()
    assert (engine.stats.queued_requests, engine.stats.active_requests) == (3, 0)
    engine.run_until_idle()
    engine.refresh_gauges()
    assert (engine.stats.queued_requests, engine.stats.active_requests) == (0, 0)


def test_a_logit_bias_on_a_core_whose_programs_take_none_is_rejected(engine):
    """The committed fixture core was prepared without logit-bias inputs: a biased request from the
    engine API (no frontend checked it) is rejected alone instead of served unbiased."""
    assert engine.scheduler.caps.logit_bias_width == open_fixture().prepared.logit_bias_width == 0
    batches: list[StepBatch] = []
    engine.connect(batches.append)
    engine.submit(request("biased", 4, logit_bias=((3, 5.0),)))
    engine.submit(request("plain", 4))
    engine.run_until_idle()
    finishes = {e.request_id: e for b in batches for e in b.events if isinstance(e, FinishEvent)}
    assert finishes["biased"].reason is FinishReason.REJECTED and "no logit bias" in finishes["biased"].message
    assert finishes["plain"].reason is FinishReason.LENGTH


def test_a_duplicate_sink_id_is_refused_and_the_running_namesake_keeps_its_end_and_count(engine):
    """A duplicate of a running sink request's id, submitted after its fourth token: refused at
    `submit` (`DuplicateRequestId`), and the frontend's later stop after token 2 still counts 2 tokens.
    Before: the duplicate was queued and rejected, and its REJECTED end went to the sink under the
    running request's id: its consumer saw its response end, and then a second end (STOP). (Earlier
    still, the rejection counted the namesake's tokens and every later one at once.)"""
    from helios.runtime.engine import DuplicateRequestId

    batches: list[StepBatch] = []
    refused = []

    def sink(batch: StepBatch) -> None:
        batches.append(batch)
        seen = tokens_of([e for b in batches for e in b.events], "s")
        if len(seen) == 4 and not refused:
            with pytest.raises(DuplicateRequestId, match="request s: a request of this id is still running"):
                engine.submit(request("s", 5))
            refused.append("s")
        if len(seen) == 6 and len(refused) == 1:
            engine.stop_matched("s", 2)
            refused.append("stopped")

    engine.connect(sink)
    engine.submit(request("s", 10, stop_strings=("zz",)))
    engine.run_until_idle()
    finishes = [e for b in batches for e in b.events if isinstance(e, FinishEvent)]
    assert refused and [f.reason for f in finishes] == [FinishReason.STOP]
    assert finishes[0].num_output_tokens == 2
    assert engine.stats.generated_tokens == 2
    assert engine.stats.requests_rejected == 0 and engine.stats.requests_finished["stop"] == 1
    again: list[StepBatch] = []
    engine.connect(again.append)
    engine.submit(request("s", 3))  # ended: its id may be used again
    engine.run_until_idle()
    assert [e.reason for b in again for e in b.events if isinstance(e, FinishEvent)] == [FinishReason.LENGTH]


def test_a_duplicate_waiting_sink_id_is_refused_and_an_on_event_namesake_is_rejected_alone(engine):
    """Two sink requests of one id both waiting for admission: before, the second was rejected
    after the first was admitted, its end reaching the first's consumer. A request with its own
    `on_event` is no sink request: its duplicate ends REJECTED there alone."""
    from helios.runtime.engine import DuplicateRequestId

    batches: list[StepBatch] = []
    inline = []
    engine.connect(batches.append)
    engine.submit(request("w", 3))
    with pytest.raises(DuplicateRequestId):
        engine.submit(request("w", 3))
    engine.submit(request("w", 3, inline.append))
    engine.run_until_idle()
    finishes = [(e.request_id, e.reason) for b in batches for e in b.events if isinstance(e, FinishEvent)]
    assert finishes == [("w", FinishReason.LENGTH)]
    assert [e.reason for e in inline if isinstance(e, FinishEvent)] == [FinishReason.REJECTED]

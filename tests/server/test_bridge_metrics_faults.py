"""`ResponseBridge` with a metrics hook (`observe`) that raises: measurement never fails a request.
The bridge is driven as its output worker drives it (`on_failure` when `on_event` raises), over a
stand-in output processor; no model and no event loop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helios.frontend.responses.output import OutputFinal
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.server.bridge import Failure, ResponseBridge


class _Output:
    """An output processor that takes every token and ends as the engine said."""

    def __init__(self):
        self.num_output_tokens = 0
        self.is_stopped = False

    def feed(self, token_id, observed_ns, values):
        self.num_output_tokens += 1
        return SimpleNamespace(events=(), observation=None, logprobs=(), prompt_logprobs=None, is_stopped=False)

    def finish(self, reason, num_reused_tokens):
        return OutputFinal((), reason, None, None, None)


class _Outbox:
    def __init__(self):
        self.items: list = []

    def post(self, deliver, items, is_terminal) -> None:
        self.items.extend(items)


def consume(bridge: ResponseBridge, event) -> None:
    """What an output worker does with one event (`helios.frontend.output_workers`)."""
    try:
        bridge.on_event(event)
    except Exception as error:  # noqa: BLE001
        bridge.on_failure(error, event)


@pytest.mark.parametrize("fails_on", [TokenEvent, FinishEvent])
def test_a_metrics_hook_that_raises_never_fails_the_response(fails_on):
    """Before: the hook's error escaped `on_event`, and the output worker's `on_failure` ended a
    response whose output succeeded with an execution error (and cancelled its request)."""
    cancelled, outbox = [], _Outbox()

    def observe(event) -> None:
        if isinstance(event, fails_on):
            raise RuntimeError("histogram broke")

    bridge = ResponseBridge("r", _Output(), is_stream=False, permit=SimpleNamespace(release=lambda: None),
                            cancel=cancelled.append, origin_ns=0, outbox=outbox, observe=observe)
    consume(bridge, TokenEvent("r", (7, 8), None))
    consume(bridge, FinishEvent("r", FinishReason.LENGTH, 3, 2, 0))
    (terminal,) = outbox.items
    assert not isinstance(terminal, Failure), terminal
    assert isinstance(terminal, OutputFinal) and terminal.reason is FinishReason.LENGTH
    assert not cancelled


class _Stopped(_Output):
    """An output processor whose stop string matched at its second token (it takes no more)."""

    def feed(self, token_id, observed_ns, values):
        if self.is_stopped:  # as `OutputProcessor`: tokens after a stop are neither shown nor counted
            return SimpleNamespace(events=(), observation=None, logprobs=(), prompt_logprobs=None, is_stopped=True)
        step = super().feed(token_id, observed_ns, values)
        step.is_stopped = self.is_stopped = self.num_output_tokens >= 2
        return step

    def finish(self, reason, num_reused_tokens):  # as `OutputProcessor.finish`: a matched stop is the end's reason
        return OutputFinal((), FinishReason.STOP if reason not in (FinishReason.ERROR, FinishReason.REJECTED)
                           else reason, None, None, None)


def stopped_bridge(outbox: _Outbox, stops: list, observed: list) -> ResponseBridge:
    """A bridge over `_Stopped` that records the stop counts it tells the engine and what it observes."""
    return ResponseBridge("r", _Stopped(), is_stream=False, permit=SimpleNamespace(release=lambda: None),
                          cancel=lambda request_id: None, origin_ns=0, outbox=outbox,
                          stop=lambda request_id, count: stops.append(count), observe=observed.append)


@pytest.mark.parametrize("reason", [FinishReason.CANCELLED, FinishReason.GRAMMAR_DEAD_END,
                                    FinishReason.GRAMMAR_LIMIT, FinishReason.LENGTH])
def test_an_end_the_engine_reached_past_a_matched_stop_is_measured_as_the_response_ends(reason):
    """The engine ended the request (cancelled, a grammar's dead end or limit) on a token past a
    stop the frontend had matched, before its `stop_matched` arrived: the response ends STOP with the
    tokens up to the stop, but `observe` got the engine's count (the tokens past the stop included)
    for every reason but EOS and the output limit."""
    observed, outbox, stops = [], _Outbox(), []
    bridge = stopped_bridge(outbox, stops, observed)
    consume(bridge, TokenEvent("r", (7, 8), None))
    consume(bridge, TokenEvent("r", (9, 10), None))  # generated before the engine was told of the stop
    consume(bridge, FinishEvent("r", reason, 3, 4, 0))
    (terminal,) = outbox.items
    assert terminal.reason is FinishReason.STOP and stops == [2]
    assert (observed[-1].reason, observed[-1].num_output_tokens) == (FinishReason.STOP, 2)


@pytest.mark.parametrize("engine_count", [0, 4])
def test_a_failure_past_a_matched_stop_counts_the_tokens_up_to_the_stop(engine_count):
    """The engine failed the request (an execution error on a step past the stop, or an engine process
    that died: no count) before its `stop_matched` arrived. The response fails as before, but `observe`
    (the metrics and the access line) got the engine's count, the tokens past the stop included, which
    no response shows or counts; one that died was settled to the processor's count already."""
    observed, outbox, stops = [], _Outbox(), []
    bridge = stopped_bridge(outbox, stops, observed)
    consume(bridge, TokenEvent("r", (7, 8), None))
    consume(bridge, TokenEvent("r", (9, 10), None))  # generated before the engine was told of the stop
    consume(bridge, FinishEvent("r", FinishReason.ERROR, 3, engine_count, 0, "boom"))
    (terminal,) = outbox.items
    assert isinstance(terminal, Failure) and stops == [2]
    assert (observed[-1].reason, observed[-1].num_output_tokens) == (FinishReason.ERROR, 2)


@pytest.mark.parametrize("forwarded", [False, True])
def test_an_interrupted_response_ends_with_the_interrupt_even_when_its_end_arrives_before_the_reader_wakes(forwarded):
    """The drain deadline's `interrupt` and the engine's end delivered in one turn of the event loop
    (the end's delivery was already scheduled): before, the end was put after the interrupt's
    failure, so `terminal` (the last item) answered the output, not the failure, and a reader of
    several bridges (`forward_to`) was given two terminal items for one choice."""
    import asyncio

    from helios.errors import ShuttingDown

    released, cancelled, forwarded_items = [], [], []

    async def scenario():
        permit = SimpleNamespace(release=lambda: released.append(1))
        bridge = ResponseBridge("r", _Output(), is_stream=False, permit=permit, cancel=cancelled.append, origin_ns=0,
                                outbox=_Outbox())
        if forwarded:
            bridge.forward_to(forwarded_items.extend)
            assert bridge.interrupt(ShuttingDown("server shutting down"))
            bridge._deliver([OutputFinal((), FinishReason.LENGTH, None, None, None)], True)
            return bridge, None
        waiter = asyncio.ensure_future(bridge.terminal())
        await asyncio.sleep(0)  # the reader waits
        assert bridge.interrupt(ShuttingDown("server shutting down"))
        bridge._deliver([OutputFinal((), FinishReason.LENGTH, None, None, None)], True)  # before the reader runs
        return bridge, await waiter

    bridge, terminal = asyncio.run(scenario())
    if forwarded:
        assert [type(item) for item in forwarded_items] == [Failure]
    else:
        assert isinstance(terminal, Failure) and isinstance(terminal.error, ShuttingDown)
    assert cancelled == ["r"] and bridge.has_terminal
    bridge.close()
    assert released == [1]  # the permit still waited for the engine's end

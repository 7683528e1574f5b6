"""One response's bridge between the frontend output workers and the event loop.

Output worker (`helios.frontend.output_workers`; never the model worker): `on_event` feeds each
generated id to the request's `OutputProcessor` (a `PromptScoresEvent` is recorded there and ends
nothing: it reaches the reader with the first step or the terminal item): observation,
detokenizing, stops, parsing and logprob entries. When a stop string matches, `stop` (the engine's
`stop_matched`) tells the engine with the number of output tokens up to the stop; the engine may
have generated a few more by then: the processor ignores every token after a stop, so they are never
shown or counted, and a finish the engine reported for them (EOS, output limit, a cancel, a grammar's
end) is settled as STOP with the processor's count before the response sees it (a failure keeps its
reason, with that count too) (`observe`, the request's metrics record, gets the settled event, with
the reason the response ends with: ERROR when the output failed, STOP when the output's last text
completed a stop). A finish that counts fewer output tokens than the processor was given (a
model worker that died or shut down ends its requests without their counts) is settled with the
processor's count, so the access log counts the tokens the response had. The resulting `OutputStep`s (streamed responses only) and the one terminal
item are handed to the event loop through a `LoopOutbox` (one `loop.call_soon_threadsafe` wakeup
per batch of deliveries, not one per request and token) into the response's unbounded list of
arrived items (`next_items` takes all of them at once): it grows as events arrive and is bounded in
total by the request's validated output budget (one step per generated token plus one terminal
item), so a paused or slow reader never blocks anyone and loses nothing. Presentation (JSON encoding) happens on the event loop.
With a stream interval N > 1 (``helios serve --stream-interval``), a stream's first step is posted
at once and later ones N at a time (the terminal item takes what is held): N times fewer
deliveries, presentations and socket writes per stream, for up to N - 1 steps of added latency.

Event loop: `next_items` awaits what has arrived (a streamed response may instead take steps in
the delivery while it waits: `read_directly`; a reader of several bridges takes every delivery in
the delivery itself: `forward_to`); `cancel` cancels the request in the engine (a
dropped connection); `close` says the reader released the response. The admission permit is
released once the response is closed AND the terminal event has arrived: finished requests have
already given back their slot and pages, but keep their permit until the body is sent or the client
is gone; a cancelled request keeps it until the engine confirmed the end.

At shutdown, `interrupt` ends a response that is still running with a `ShuttingDown` failure (its
request is cancelled; the permit still waits for the engine's confirmation).

Every request produces exactly one terminal item: an `OutputFinal`, or a `Failure` carrying the
typed error (admission rejection, execution failure, or an output-processing failure, which cancels
the request in the engine and is reported as an execution error: the processor's own failures are
caught in `on_event`, anything else the output worker reports through `on_failure`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable, Union

from helios.errors import ExecutionError, HeliosError
from helios.frontend.responses.output import OutputFinal, OutputProcessor, OutputStep
from helios.frontend.responses.presentation import failure_error, finish_reason
from helios.runtime.records.events import FinishEvent, FinishReason, PromptScoresEvent, RequestEvent, TokenEvent
from helios.server.admission import Permit

logger = logging.getLogger(__name__)

_FAILURES = (FinishReason.REJECTED, FinishReason.ERROR)


@dataclass(frozen=True)
class Failure:
    """The terminal item of a request that ended in error; the class of `error` decides the status."""

    error: HeliosError


Terminal = Union[OutputFinal, Failure]
Item = Union[OutputStep, OutputFinal, Failure]
Delivery = Callable[[list, bool], None]


class LoopOutbox:
    """Deliveries from the output side to one event loop, batched: a poster appends to a deque
    (atomic, no lock: a lock the loop's drain also takes made posters wait for the loop) and wakes
    the loop only when no drain is pending, so a round of many requests costs one wakeup.
    Deliveries run on the loop in the order they were posted.

    Why no delivery is stranded: a poster appends before it reads `_is_scheduled`, and a drain
    clears `_is_scheduled` before it empties the deque; so an item appended after a drain's last
    pop finds the flag clear and schedules the next drain (at worst a drain finds nothing)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._pending: deque[tuple[Delivery, list, bool]] = deque()
        self._is_scheduled = False

    def post(self, deliver: Delivery, items: list, is_terminal: bool) -> None:
        """Any thread; never blocks on the loop."""
        self._pending.append((deliver, items, is_terminal))
        if self._is_scheduled:
            return
        self._is_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop is closed: nobody is left to read these responses
            pass

    def _drain(self) -> None:
        self._is_scheduled = False
        pending = self._pending
        while pending:
            deliver, items, is_terminal = pending.popleft()
            deliver(items, is_terminal)


class ResponseBridge:
    """See the module docstring. Worker-side methods run in the request's output worker only;
    loop-side methods (`next_items`, `cancel`, `close`) on the event loop only."""

    def __init__(
        self,
        request_id: str,
        output: OutputProcessor,
        *,
        is_stream: bool,
        permit: Permit,
        cancel: Callable[[str], None],
        origin_ns: int,
        outbox: LoopOutbox,
        stop: Callable[[str, int], None] | None = None,
        observe: Callable[[RequestEvent], None] | None = None,
        stream_interval: int = 1,
        show_finish: Callable[[str], None] | None = None,
    ):
        """`show_finish`: told the finish reason a successful response shows its client (before
        `observe` gets the end), which can differ from the engine's (``tool_calls`` for an end of
        sequence after tool calls): the access line writes what the client saw."""
        self.request_id = request_id
        self._output = output
        self._is_stream = is_stream
        self._permit = permit
        self._cancel = cancel
        self._origin_ns = origin_ns
        self._outbox = outbox
        self._stop = stop
        self._observe = observe
        self._show_finish = show_finish
        self._has_hook_failed = False  # logged once per response, not once per token
        self._stream_interval = stream_interval
        self._held: list[OutputStep] = []  # worker side: steps waiting for the stream interval
        self._has_posted_step = False  # worker side
        self._arrived: list[Item] = []  # loop side: items not yet taken by `next_items`
        self._waiter: asyncio.Future | None = None  # loop side: `next_items` waiting for items
        self._direct: Callable[[list[Item]], bool] | None = None  # loop side: see `read_directly`
        self._forward: Callable[[list[Item]], None] | None = None  # loop side: see `forward_to`
        self._is_woken = False  # loop side: `wake` ended the wait
        self._failure: HeliosError | None = None  # worker side: output processing failed
        self._is_stop_sent = False  # worker side
        self._is_terminal_posted = False  # worker side
        self._has_terminal = False  # loop side
        self._is_closed = False
        self._is_cancel_sent = False
        self._is_interrupted = False

    # -- output worker ---------------------------------------------------------------------------

    def on_event(self, event: RequestEvent) -> None:
        """One engine event of this request, in order; never blocks."""
        if isinstance(event, FinishEvent):
            self._finish(self._settled(event))
            return
        if self._observe is not None:
            self._observed(event)
        if self._is_terminal_posted:
            return
        if isinstance(event, TokenEvent):
            steps = self._feed(event)
            if steps:
                self._post_steps(steps)
            if self._output.is_stopped and not self._is_stop_sent and self._stop is not None:
                self._is_stop_sent = True
                self._stop(self.request_id, self._output.num_output_tokens)
        elif isinstance(event, PromptScoresEvent):  # not the end: the scores wait for the first token
            self._score_prompt(event)

    def _finish(self, event: FinishEvent) -> None:
        """The end: the terminal item, and `observe` told the end as the response ends (a failure
        of the output's end is an ERROR; a stop found in the output's last text a STOP)."""
        terminal = None if self._is_terminal_posted else self._terminal(event)
        if isinstance(terminal, Failure) and event.reason not in _FAILURES:
            event = event._replace(reason=FinishReason.ERROR)
        elif isinstance(terminal, OutputFinal) and terminal.reason is not event.reason:
            event = event._replace(reason=terminal.reason)
        if isinstance(terminal, OutputFinal) and self._show_finish is not None:
            self._shown(terminal)
        if self._observe is not None:
            self._observed(event)
        if terminal is not None:
            self._post_terminal(terminal)

    def _observed(self, event: RequestEvent) -> None:
        """Tells `observe` of `event`; a hook that raises is ignored: measurement never fails a
        request (its error would reach `on_failure` and end a response whose output succeeded)."""
        self._hooked(self._observe, event)

    def _shown(self, final: OutputFinal) -> None:
        """Tells `show_finish` the finish reason `final` shows; like `_observed`, never fails."""
        self._hooked(lambda final: self._show_finish(finish_reason(final)), final)

    def _hooked(self, hook: Callable[[object], None], value: object) -> None:
        try:
            hook(value)
        except Exception:  # noqa: BLE001 - logged once, so a broken hook does not go unnoticed
            if not self._has_hook_failed:
                self._has_hook_failed = True
                logger.exception("a request's metrics hook failed (the request goes on)")

    def on_failure(self, error: Exception, event: RequestEvent) -> None:
        """The output worker caught `error` from `on_event(event)`: this request ends with an
        execution error (cancelled in the engine; the terminal item now if `event` was its end)."""
        if self._failure is None:
            self._failure = ExecutionError(f"output processing failed: {type(error).__name__}: {error}")
            self._cancel(self.request_id)
        if isinstance(event, FinishEvent):
            self._post_terminal(Failure(self._failure))

    def _settled(self, event: FinishEvent) -> FinishEvent:
        """The engine's end, settled against a stop the processor matched before it, and against
        the tokens the processor was given (an end reported without its count)."""
        num_output_tokens = self._output.num_output_tokens
        if self._output.is_stopped:  # an end reached past the stop, whose tokens are neither shown nor counted
            reason = event.reason if event.reason in _FAILURES else FinishReason.STOP  # a failure still fails
            return event._replace(reason=reason, num_output_tokens=num_output_tokens)
        if event.num_output_tokens < num_output_tokens:
            return event._replace(num_output_tokens=num_output_tokens)
        return event

    def _post_steps(self, steps: list[OutputStep]) -> None:
        """Posts `steps`: at once for the first and with a stream interval of 1, else once
        `stream_interval` steps are held (the terminal item takes whatever is held with it)."""
        if self._stream_interval > 1 and self._has_posted_step:
            self._held.extend(steps)
            if len(self._held) < self._stream_interval:
                return
            steps, self._held = self._held, []
        self._has_posted_step = True
        self._post(steps, is_terminal=False)

    def _post_terminal(self, item: Terminal) -> None:
        if not self._is_terminal_posted:
            self._is_terminal_posted = True
            held, self._held = self._held, []
            self._post([*held, item], is_terminal=True)

    def _feed(self, event: TokenEvent) -> list[OutputStep]:
        if self._failure is not None:
            return []
        observed_ns = None if event.observed_ns is None else event.observed_ns - self._origin_ns
        steps = []
        try:
            logprobs = event.logprobs or (None,) * len(event.token_ids)
            for token_id, values in zip(event.token_ids, logprobs):
                step = self._output.feed(token_id, observed_ns, values)
                if self._is_stream and (step.events or step.observation is not None or step.logprobs
                                        or step.prompt_logprobs is not None):
                    steps.append(step)
                if step.is_stopped:
                    break
        except Exception as error:  # noqa: BLE001 - an output failure ends this request, not the worker
            self._failure = ExecutionError(f"output processing failed: {type(error).__name__}: {error}")
            self._cancel(self.request_id)
            return []
        return steps

    def _score_prompt(self, event: PromptScoresEvent) -> None:
        if self._failure is not None:
            return
        try:
            self._output.score_prompt(event)
        except Exception as error:  # noqa: BLE001 - an output failure ends this request, not the worker
            self._failure = ExecutionError(f"output processing failed: {type(error).__name__}: {error}")
            self._cancel(self.request_id)

    def _terminal(self, event: FinishEvent) -> Terminal:
        if event.reason in _FAILURES:
            return Failure(failure_error(event.reason, event.message))
        if self._failure is not None:
            return Failure(self._failure)
        try:
            return self._output.finish(event.reason, event.num_reused_tokens)
        except Exception as error:  # noqa: BLE001
            return Failure(ExecutionError(f"output processing failed: {type(error).__name__}: {error}"))

    def _post(self, items: list[Item], is_terminal: bool) -> None:
        self._outbox.post(self._deliver, items, is_terminal)

    # -- event loop ------------------------------------------------------------------------------

    @property
    def has_terminal(self) -> bool:
        return self._has_terminal

    def _deliver(self, items: list[Item], is_terminal: bool) -> None:
        if not self._is_interrupted:  # else the interrupt's failure was the reader's last item
            self._put(items)
        if is_terminal:
            self._has_terminal = True
            self._release_when_done()

    def _put(self, items: list[Item]) -> None:
        if self._forward is not None:
            self._forward(items)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            direct = self._direct
            if direct is not None and not isinstance(items[-1], (OutputFinal, Failure)) and direct(items):
                return  # taken while the reader waits: no wakeup of its task
            self._arrived.extend(items)
            waiter.set_result(None)
        else:
            self._arrived.extend(items)

    def read_directly(self, take: Callable[[list[Item]], bool] | None) -> None:
        """While `next_items` waits, steps that arrive (never the terminal item) go to `take(items)`
        on the event loop's delivery instead of waking the waiting task; `take` returns False to
        leave them to `next_items`. None stops it."""
        self._direct = take

    def forward_to(self, take: Callable[[list[Item]], None] | None) -> None:
        """Every delivery from now on (the terminal item included) goes to `take(items)` on the
        event loop instead of to `next_items`; items that arrived before go to it at once. For a
        reader of several bridges (`helios.server.fanout`). None stops it."""
        self._forward = take
        if take is not None and self._arrived:
            items, self._arrived = self._arrived, []
            take(items)

    def wake(self) -> None:
        """Ends a pending `next_items` wait with whatever has arrived (possibly nothing)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._is_woken = True
            waiter.set_result(None)

    async def next_items(self) -> list[Item]:
        """Every item that has arrived, waiting for at least one (or for `wake`, which may leave
        none). The last item of the response is its terminal item; nothing follows it."""
        while not self._arrived:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            if self._is_woken:
                self._is_woken = False
                break
        items, self._arrived = self._arrived, []
        return items

    async def terminal(self) -> Terminal:
        """Waits for the terminal item, dropping any steps (non-streamed responses)."""
        while True:
            items = await self.next_items()
            if items and isinstance(items[-1], (OutputFinal, Failure)):
                return items[-1]

    def interrupt(self, error: HeliosError) -> bool:
        """Ends a response still running with `error` as its terminal item (the reader sees nothing
        after it) and cancels its request; False when the response already ended or was released."""
        if self._has_terminal or self._is_closed or self._is_interrupted:
            return False
        self._is_interrupted = True
        self._put([Failure(error)])
        self.cancel()
        return True

    def cancel(self) -> None:
        """The client is gone before the end: cancel the request in the engine (idempotent)."""
        if not self._has_terminal and not self._is_cancel_sent:
            self._is_cancel_sent = True
            self._cancel(self.request_id)

    def close(self) -> None:
        """The reader released the response (sent, or the client is gone); idempotent."""
        self._is_closed = True
        self.cancel()
        self._release_when_done()

    def _release_when_done(self) -> None:
        if self._is_closed and self._has_terminal:
            self._permit.release()

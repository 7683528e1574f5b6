"""The engine's message boundary: what the model worker emits and the commands it consumes.

The worker emits one `StepBatch` per round (after a plan completes, and after the admissions and
commands it applied): the round's token, prompt-score and finish events of every request, in order,
as plain records. A sink (`EventSink`, see `Engine.connect`) takes the batch and must not block: the
server's output workers (`helios.frontend.output_workers`) queue it and do detokenizing, stop
matching, parsing and presentation on their own threads while the worker packs the next step.

Commands flow the other way, as records the worker applies before it plans again: admission
(`Engine.submit`), `Cancel` (client gone, output failure) and `StopMatched` (the frontend found a stop
string in a request's text: the request ends with STOP, counting `num_output_tokens` output tokens,
the one that crossed the stop included; tokens the worker generated past it are dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Union

from helios.runtime.records.events import FinishEvent, FinishReason, RequestEvent


@dataclass(frozen=True)
class StepBatch:
    """The events one worker round produced, in emission order (each request's in its own order)."""

    events: tuple[RequestEvent, ...]


EventSink = Callable[[StepBatch], None]


class Cancel(NamedTuple):
    request_id: str


class StopMatched(NamedTuple):
    request_id: str
    num_output_tokens: int  # output tokens up to and including the one whose text completed the stop


Command = Union[Cancel, StopMatched]


OnEvent = Callable[[RequestEvent], None]


class Outbox:
    """The worker's side of the boundary: where each request's events go, and the generated-token
    count. A request's `on_event` (None: the sink's) is called at once; the sink's events collect
    into the round's batch until `flush`. Used by the model worker thread only."""

    def __init__(self, stats, sink: EventSink | None = None):
        self.sink = sink
        self._stats = stats
        self._outgoing: list[RequestEvent] = []  # this round's events, for the sink
        self._uncounted: dict[str, int] = {}  # tokens of the sink's host-stop requests, counted at their end
        # The sink's requests submitted and not yet ended: `Engine.submit` adds an id (any thread, under
        # the engine's lock; it refuses one already here), their end takes it off (a set's `add`,
        # `discard` and `in` are each atomic).
        self.outstanding: set[str] = set()

    def admit(self, request_id: str, on_event: OnEvent | None, has_host_stops: bool) -> None:
        """A request the frontend may stop late: its tokens count when it ends (see `end`)."""
        if on_event is None and has_host_stops:
            self._uncounted[request_id] = 0

    def deliver(self, on_event: OnEvent | None, event: RequestEvent) -> None:
        """A token or prompt-score event; an `on_event` that raises raises here."""
        if on_event is None:
            self._outgoing.append(event)
        else:
            on_event(event)

    def count(self, event) -> None:
        """Counts a token event's tokens (a request the frontend may stop late: at its end)."""
        if event.request_id in self._uncounted:
            self._uncounted[event.request_id] += len(event.token_ids)
        else:
            self._stats.generated_tokens += len(event.token_ids)

    def deliver_tokens(self, on_event: OnEvent | None, event) -> None:
        """`count(event)`, then `deliver(on_event, event)`: a token event's whole path, in one call."""
        if self._uncounted and event.request_id in self._uncounted:
            self._uncounted[event.request_id] += len(event.token_ids)
        else:
            self._stats.generated_tokens += len(event.token_ids)
        if on_event is None:
            self._outgoing.append(event)
        else:
            on_event(event)

    def end(self, on_event: OnEvent | None, event: FinishEvent) -> None:
        """A terminal event; counts what the request's tokens left to count (a STOP's count is the
        frontend's, without the tokens generated past the stop). An `on_event` that raises on it
        has nothing left to fail."""
        uncounted = self._uncounted.pop(event.request_id, 0)
        if event.reason is FinishReason.STOP:
            uncounted = min(uncounted, event.num_output_tokens)
        self._stats.generated_tokens += uncounted
        self.end_unadmitted(on_event, event)

    def end_unadmitted(self, on_event: OnEvent | None, event: FinishEvent) -> None:
        """The terminal event of a request never admitted (rejected, failed at admission, cancelled
        in the ingress channel), delivered as `end` delivers it, counting nothing: a running request
        of the same id (whose duplicate is rejected) keeps its tokens to count at its own end."""
        if on_event is None:
            self._outgoing.append(event)
            self.outstanding.discard(event.request_id)
            return
        try:
            on_event(event)
        except Exception:  # noqa: BLE001 - the request is over either way
            pass

    def flush(self) -> None:
        """Hands this round's events to the sink as one batch."""
        if self._outgoing:
            batch, self._outgoing = StepBatch(tuple(self._outgoing)), []
            self.sink(batch)

    def close(self) -> None:
        """Counts the tokens of requests that end without their finish being counted (a worker
        that stops or fails)."""
        self._stats.generated_tokens += sum(self._uncounted.values())
        self._uncounted.clear()

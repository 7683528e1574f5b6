"""Per-request latency and length histograms, and the per-request record the access log reads.

`RequestRecord` is made when a request arrives (the access-log middleware puts it in the ASGI
scope's state). The service stamps it when it hands the request to the model worker, and
`event_stamps` stamps it from the request's events on its output worker (the response bridge
calls it with each event, a finish settled against a stop the frontend found): the first token event
stamps the first token, the finish event the end and the token counts, and the histograms of a
request that finished (not rejected, failed or cancelled) are observed then. One monotonic clock
read per token event; nothing of it runs on the model worker.

Histograms (seconds unless said; label ``model_name``, the served id):

- ``helios_time_to_first_token_seconds``: arrival to the first generated token;
- ``helios_time_per_output_token_seconds``: first to last token over the tokens after the first
  (requests of two or more tokens);
- ``helios_e2e_request_latency_seconds``: arrival to the finish event;
- ``helios_request_queue_time_seconds``: arrival until the model worker takes the request
  (admission permit, preparation slots and preparation: scheduler waiting after that is part of
  the time to first token);
- ``helios_request_prompt_tokens`` and ``helios_request_generation_tokens``: lengths.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import CollectorRegistry, Histogram

from helios.runtime.records.events import FinishEvent, FinishReason, RequestEvent, TokenEvent

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0, 320.0, 640.0)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                          0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_LENGTH_BUCKETS = tuple(float(2**i) for i in range(0, 21))
_FINISHED = (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)


@dataclass
class RequestRecord:
    """What one request's access-log line and histograms need (monotonic seconds)."""

    arrival_s: float
    model_name: str = ""
    user: str | None = None
    submitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None
    choices: list[RequestRecord] = field(default_factory=list)  # the other choices (n, batched prompts)

    @classmethod
    def now(cls) -> RequestRecord:
        return cls(time.monotonic())

    def choice(self) -> RequestRecord:
        """A record for one more choice of this request, counted in its access-log line."""
        record = RequestRecord(self.arrival_s, self.model_name, self.user)
        self.choices.append(record)
        return record

    def totals(self) -> tuple[int, int] | None:
        """(prompt, output) tokens summed over every choice that finished (each choice is its own
        engine request); None before any did."""
        done = [r for r in (self, *self.choices) if r.num_prompt_tokens is not None]
        if not done:
            return None
        return sum(r.num_prompt_tokens for r in done), sum(r.num_output_tokens or 0 for r in done)


class LatencyHistograms:
    """The histograms of the module docstring, registered in the server's registry."""

    def __init__(self, registry: CollectorRegistry):
        def histogram(name: str, documentation: str, buckets) -> Histogram:
            return Histogram(name, documentation, ["model_name"], registry=registry, buckets=buckets)

        self.ttft = histogram("helios_time_to_first_token_seconds", "Arrival to the first generated token",
                              _LATENCY_BUCKETS)
        self.tpot = histogram("helios_time_per_output_token_seconds", "Seconds per output token after the first",
                              _TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("helios_e2e_request_latency_seconds", "Arrival to the end of generation",
                             _LATENCY_BUCKETS)
        self.queue = histogram("helios_request_queue_time_seconds",
                               "Arrival until the model worker takes the request (admission and preparation)",
                               _LATENCY_BUCKETS)
        self.prompt = histogram("helios_request_prompt_tokens", "Prompt tokens per finished request", _LENGTH_BUCKETS)
        self.generation = histogram("helios_request_generation_tokens", "Generated tokens per finished request",
                                    _LENGTH_BUCKETS)

    def observe(self, record: RequestRecord) -> None:
        """Observes a finished request's record (every stamp set)."""
        name = record.model_name
        if record.submitted_s is not None:
            self.queue.labels(name).observe(record.submitted_s - record.arrival_s)
        if record.first_token_s is not None:
            self.ttft.labels(name).observe(record.first_token_s - record.arrival_s)
            if record.num_output_tokens and record.num_output_tokens > 1 and record.finished_s is not None:
                span = record.finished_s - record.first_token_s
                self.tpot.labels(name).observe(span / (record.num_output_tokens - 1))
        if record.finished_s is not None:
            self.e2e.labels(name).observe(record.finished_s - record.arrival_s)
        self.prompt.labels(name).observe(record.num_prompt_tokens or 0)
        self.generation.labels(name).observe(record.num_output_tokens or 0)


def event_stamps(record: RequestRecord, histograms: LatencyHistograms) -> Callable[[RequestEvent], None]:
    """A callable that stamps `record` from each of its request's events (never raises)."""

    def stamping(event: RequestEvent) -> None:
        try:
            if isinstance(event, FinishEvent):
                record.finished_s = time.monotonic()
                record.num_prompt_tokens = event.num_prompt_tokens
                record.num_output_tokens = event.num_output_tokens
                record.finish_reason = event.reason.name.lower()
                if event.reason in _FINISHED:
                    histograms.observe(record)
            elif isinstance(event, TokenEvent) and record.first_token_s is None and event.token_ids:
                record.first_token_s = time.monotonic()
        except Exception:  # noqa: BLE001 - measurement never fails a request
            pass

    return stamping

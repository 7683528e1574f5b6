"""Per-request counters and histograms, and the per-request record the access log reads.

`RequestRecord` is made when a request arrives (the access-log middleware puts it in the ASGI
scope's state). A request of several choices (``n``, batched prompts) gets one more record per
choice (`RequestRecord.choices`), all made before the first choice is submitted, so that the
request's end (every choice's finish) is known. The service stamps the record when it hands the
request to the model worker, and `event_stamps` stamps each choice's record from its events on its
output worker (the response bridge calls it with each event, the finish as the response ends:
settled against a stop the frontend found, an ERROR when the output failed, so its counts and
reason are those of the response). One monotonic clock read per token event; nothing of it runs on
the model worker. A choice's record also knows its prompt's length from its submission
(`prompt_len`) and the output tokens that arrived, which the access line of a response that ended
before the choice did (a stream whose client left) writes (`RequestRecord.logged_totals`).

Counters (what the responses' usage says, so they equal the sum of usage over responses):

- ``helios_requests_finished{reason}``: engine requests (one per choice) by their settled terminal
  reason (``eos``, ``stop``, ``length``, ``cancelled``, ``error``, ``grammar_dead_end``,
  ``grammar_limit``; a scheduler rejection is ``helios_requests_rejected``);
- ``helios_prompt_tokens``: each prompt of a request once (as usage counts it), counted when its
  first choice ends (finished or cancelled; not when rejected or failed);
- ``helios_generated_tokens``: output tokens as usage counts them, counted as they arrive (a request
  with stops or hidden output at its end: tokens past a stop, or the token ``max_tokens: 0``
  samples, are never counted); a choice that failed after some output counts the output it was
  given (its access line's count), with stops or without.

Histograms (seconds unless said; label ``model_name``, the served id), one observation per request
(not per choice):

- ``helios_time_to_first_token_seconds``: arrival to the first output token of any choice (observed
  when it arrives, for requests with an output token, cancelled ones included);
- the others once every choice ended, for a request none of whose choices was rejected or failed
  (finished or cancelled):
  ``helios_time_per_output_token_seconds``: first token to the last choice's end over the tokens
  after the first of the longest choice (two tokens or more);
  ``helios_e2e_request_latency_seconds``: arrival to the last choice's end;
  ``helios_request_queue_time_seconds``: arrival until the model worker takes the request
  (admission permit, preparation slots and preparation: scheduler waiting after that is part of
  the time to first token);
  ``helios_request_prompt_tokens`` and ``helios_request_generation_tokens``: the request's usage.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

from helios.runtime.records.events import FinishEvent, FinishReason, RequestEvent, TokenEvent

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0, 320.0, 640.0)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                          0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_LENGTH_BUCKETS = tuple(float(2**i) for i in range(0, 21))
_FAILED = (FinishReason.REJECTED, FinishReason.ERROR)
_FAILED_NAMES = tuple(reason.name.lower() for reason in _FAILED)
CANCELLED = FinishReason.CANCELLED.name.lower()  # a cut response's access-line reason, as the metrics name it
_REASONS = (FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.ERROR,
            FinishReason.GRAMMAR_DEAD_END, FinishReason.GRAMMAR_LIMIT)


@dataclass
class RequestRecord:
    """What one request's access-log line and metrics need (monotonic seconds). The request's
    first record holds its other choices' records; each choice's fields are its own."""

    arrival_s: float
    model_name: str = ""
    user: str | None = None
    submitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    num_reused_tokens: int | None = None  # prompt tokens served from the prefix cache (the engine's)
    finish_reason: str | None = None  # the engine's settled reason, as the metrics count it
    shown_finish_reason: str | None = None  # the one the response showed its client (`ResponseBridge`)
    prompt_len: int | None = None  # the choice's prompt tokens, set when it is submitted to the engine
    prompt_index: int = 0  # which prompt of a batch this choice continues
    choices: list[RequestRecord] = field(default_factory=list)  # the other choices (n, batched prompts)
    _request: RequestRecord | None = field(default=None, repr=False, compare=False)  # a choice's first record
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _num_counted_tokens: int = field(default=0, repr=False, compare=False)
    _num_arrived_tokens: int = field(default=0, repr=False, compare=False)  # output tokens its events brought
    _has_first_token: bool = field(default=False, repr=False, compare=False)  # the request's, on its first record
    _counted_prompts: set[int] = field(default_factory=set, repr=False, compare=False)

    @classmethod
    def now(cls) -> RequestRecord:
        return cls(time.monotonic())

    def choice(self, prompt_index: int = 0) -> RequestRecord:
        """A record for one more choice of this request (of prompt `prompt_index`), counted in its
        access-log line; make every choice's record before the first choice is submitted."""
        record = RequestRecord(self.arrival_s, self.model_name, self.user, prompt_index=prompt_index, _request=self)
        self.choices.append(record)
        return record

    @property
    def request(self) -> RequestRecord:
        """The request's first record (this one, unless this is another choice's)."""
        return self._request or self

    def show_finish(self, reason: str) -> None:
        """Notes the finish reason the choice's response showed its client (``tool_calls`` where
        the engine's is ``eos``), which the access line writes."""
        self.shown_finish_reason = reason

    def totals(self) -> tuple[int, int] | None:
        """(prompt, output) tokens as usage counts them: each prompt once, every choice's output,
        over the choices that ended (each choice is its own engine request); None before any did."""
        done = [r for r in (self, *self.choices) if r.num_prompt_tokens is not None]
        if not done:
            return None
        prompts = {r.prompt_index: r.num_prompt_tokens for r in done}
        return sum(prompts.values()), sum(r.num_output_tokens or 0 for r in done)

    def logged_totals(self) -> tuple[int, int, str | None] | None:
        """(prompt tokens, output tokens, finish reason) as the access line writes them once the
        response ended: `totals` and the first choice's reason (the one its client saw where the
        bridge told it: `show_finish`), or the first failed choice's (by
        index) where one failed, as the response is that failure (its status, or a stream's error
        event). A choice submitted (`prompt_len`) but not ended then was cut: the response ended
        first (its client went away, a send timed out, shutdown dropped it, a sibling's failure
        ended it) and its close cancelled the choice, whose end the engine confirms later (the JSON
        path waits for it; a stream ends at once). It counts its prompt and the output tokens that
        had arrived, and the reason is ``cancelled`` unless a choice failed. None when no choice
        was submitted. Safe beside a choice's end arriving on its output worker (`_finish` writes
        its prompt count last, after its reason)."""
        records = [r for r in (self, *self.choices) if r.num_prompt_tokens is not None or r.prompt_len is not None]
        if not records:
            return None
        prompts, num_output_tokens, is_cut, failure = {}, 0, False, None
        for r in records:
            num_prompt_tokens = r.num_prompt_tokens
            if num_prompt_tokens is None:  # cut: what it had when the response ended
                is_cut = True
                prompts.setdefault(r.prompt_index, r.prompt_len)
                num_output_tokens += r._num_arrived_tokens
            else:
                prompts[r.prompt_index] = num_prompt_tokens
                num_output_tokens += r.num_output_tokens or 0
                if failure is None and r.finish_reason in _FAILED_NAMES:
                    failure = r.finish_reason
        reason = failure or (CANCELLED if is_cut else self.shown_finish_reason or self.finish_reason)
        return sum(prompts.values()), num_output_tokens, reason


class LatencyHistograms:
    """The counters and histograms of the module docstring, registered in the server's registry."""

    def __init__(self, registry: CollectorRegistry):
        def histogram(name: str, documentation: str, buckets) -> Histogram:
            return Histogram(name, documentation, ["model_name"], registry=registry, buckets=buckets)

        self.finished = Counter("helios_requests_finished", "Engine requests (one per choice) finished, by terminal "
                                "reason", ["reason"], registry=registry)
        for reason in _REASONS:  # every reason from the start, at zero
            self.finished.labels(reason.name.lower())
        self.prompt_tokens = Counter("helios_prompt_tokens", "Prompt tokens of finished and cancelled requests, "
                                     "each prompt once (as usage counts them)", registry=registry)
        self.generated_tokens = Counter("helios_generated_tokens", "Output tokens (as usage counts them)",
                                        registry=registry)
        self.ttft = histogram("helios_time_to_first_token_seconds", "Arrival to the first generated token",
                              _LATENCY_BUCKETS)
        self.tpot = histogram("helios_time_per_output_token_seconds", "Seconds per output token after the first",
                              _TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("helios_e2e_request_latency_seconds", "Arrival to the end of generation",
                             _LATENCY_BUCKETS)
        self.queue = histogram("helios_request_queue_time_seconds",
                               "Arrival until the model worker takes the request (admission and preparation)",
                               _LATENCY_BUCKETS)
        self.prompt = histogram("helios_request_prompt_tokens", "Prompt tokens per request", _LENGTH_BUCKETS)
        self.generation = histogram("helios_request_generation_tokens", "Generated tokens per request",
                                    _LENGTH_BUCKETS)

    def observe(self, request: RequestRecord) -> None:
        """Observes an ended request (every choice's record finished; see the module docstring)."""
        records = (request, *request.choices)
        name = request.model_name
        if request.submitted_s is not None:
            self.queue.labels(name).observe(request.submitted_s - request.arrival_s)
        finished_s = max(r.finished_s for r in records)
        first_s = [r.first_token_s for r in records if r.first_token_s is not None]
        longest = max(r.num_output_tokens or 0 for r in records)
        if first_s and longest > 1:
            self.tpot.labels(name).observe((finished_s - min(first_s)) / (longest - 1))
        self.e2e.labels(name).observe(finished_s - request.arrival_s)
        prompt_tokens, output_tokens = request.totals()
        self.prompt.labels(name).observe(prompt_tokens)
        self.generation.labels(name).observe(output_tokens)


def event_stamps(record: RequestRecord, histograms: LatencyHistograms, *, counts_at_end: bool = False,
                 hides_output: bool = False) -> Callable[[RequestEvent], None]:
    """A callable that stamps `record` (one choice's) from each of its request's events and counts
    them (never raises). `counts_at_end`: the choice may stop past tokens it was given (stops), so
    its tokens count at its end; `hides_output`: its output is not shown (``max_tokens: 0``), so
    it has no first token and no output tokens."""
    request = record.request
    counts_at_end = counts_at_end or hides_output

    def stamping(event: RequestEvent) -> None:
        try:
            if isinstance(event, FinishEvent):
                _finish(record, event, histograms, hides_output)
            elif isinstance(event, TokenEvent) and event.token_ids and not hides_output:
                if record.first_token_s is None:
                    record.first_token_s = time.monotonic()
                    with request._lock:
                        is_first, request._has_first_token = not request._has_first_token, True
                    if is_first:
                        histograms.ttft.labels(request.model_name).observe(record.first_token_s - request.arrival_s)
                record._num_arrived_tokens += len(event.token_ids)
                if not counts_at_end:
                    record._num_counted_tokens += len(event.token_ids)
                    histograms.generated_tokens.inc(len(event.token_ids))
        except Exception:  # noqa: BLE001 - measurement never fails a request
            pass

    return stamping


def _finish(record: RequestRecord, event: FinishEvent, histograms: LatencyHistograms, hides_output: bool) -> None:
    """Stamps and counts one choice's end; observes the request once its last choice ended."""
    request = record.request
    num_output_tokens = 0 if hides_output else event.num_output_tokens
    record.finished_s = time.monotonic()
    record.num_output_tokens = num_output_tokens
    record.num_reused_tokens = event.num_reused_tokens
    record.finish_reason = event.reason.name.lower()
    is_failed = event.reason in _FAILED
    if event.reason is not FinishReason.REJECTED:
        histograms.finished.labels(record.finish_reason).inc()
    # a failure too: a choice with stops counts at its end what one without counted as it arrived
    if num_output_tokens > record._num_counted_tokens:
        histograms.generated_tokens.inc(num_output_tokens - record._num_counted_tokens)
        record._num_counted_tokens = num_output_tokens
    with request._lock:
        is_new_prompt = not is_failed and record.prompt_index not in request._counted_prompts
        if is_new_prompt:
            request._counted_prompts.add(record.prompt_index)
        record.num_prompt_tokens = event.num_prompt_tokens  # last: `totals` reads the choices that ended
        records = (request, *request.choices)
        is_last = all(r.num_prompt_tokens is not None for r in records)
    if is_new_prompt:
        histograms.prompt_tokens.inc(event.num_prompt_tokens)
    if is_last and all(r.finish_reason not in _FAILED_NAMES for r in records):
        histograms.observe(request)

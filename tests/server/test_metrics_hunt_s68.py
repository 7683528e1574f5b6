"""/metrics and the access log agree on each request (session 68's hunt).

- `helios_http_responses_total` counts the status the access log writes: a response whose first
  write (its ``http.response.start``) failed is 499 when its client was gone or the write timed out
  and the application dropped the answer, 500 when the application raised on; a request left
  unanswered, or cancelled before its answer started, is 500. The counter counted the status the
  application tried to send before the write (200), and nothing for a request with no answer. The
  middleware stack is composed as `create_app` composes it (access log, `ClientGoneGuard`, response
  counter) over bare applications.
- The access line's ``ttft_ms`` of a request of several choices is its first output token's,
  whichever choice brought it, as ``helios_time_to_first_token_seconds`` times it; it was the
  first choice's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helios.runtime.records.stats import WorkerStats
from helios.server.access import AccessLog, access_line
from helios.server.metrics import ResponseCounter, ServerMetrics
from helios.server.request_metrics import RequestRecord
from helios.server.responses import ClientGoneGuard

ENDPOINTS = {"/v1/completions": "completions"}


def statuses(metrics: ServerMetrics) -> dict[str, float]:
    return {sample.labels["status"]: sample.value
            for family in text_string_to_metric_families(metrics.render().decode())
            for sample in family.samples if sample.name == "helios_http_responses_total"}


@pytest.mark.parametrize("error, expected", [(ConnectionResetError("reset by peer"), "499"),
                                             (RuntimeError("not a disconnect"), "500")])
def test_a_response_whose_first_write_fails_counts_as_the_access_log_writes_it(runner, caplog, error, expected):
    metrics = ServerMetrics(WorkerStats().snapshot)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        raise error

    stack = AccessLog(ClientGoneGuard(ResponseCounter(app, metrics.http_responses, ENDPOINTS)))
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "client": ("127.0.0.1", 1)}
    with caplog.at_level(logging.INFO, logger="helios.access"):
        try:
            runner.run(stack(scope, receive, send))
        except RuntimeError:
            assert expected == "500"  # the server's error handler answers it
    lines = [r.getMessage() for r in caplog.records if r.name == "helios.access"]
    assert len(lines) == 1 and lines[0].split()[3] == expected
    assert statuses(metrics) == {expected: 1.0}



async def start_timing_out(scope, receive, send):
    """A response whose first write takes too long: dropped, as `send_leased` drops it."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(send({"type": "http.response.start", "status": 200, "headers": []}), 0.01)


async def unanswered(scope, receive, send):
    """An application that returns without answering (the server answers 500)."""


async def cancelled(scope, receive, send):
    """A request cancelled before its answer started (a connection dropped at the drain deadline)."""
    raise asyncio.CancelledError


@pytest.mark.parametrize("app, expected", [(start_timing_out, "499"), (unanswered, "500"), (cancelled, "500")])
def test_a_request_without_an_answer_counts_as_the_access_log_writes_it(runner, caplog, app, expected):
    metrics = ServerMetrics(WorkerStats().snapshot)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        await asyncio.Event().wait()  # a client that reads nothing

    stack = AccessLog(ClientGoneGuard(ResponseCounter(app, metrics.http_responses, ENDPOINTS)))
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "client": ("127.0.0.1", 1)}
    with caplog.at_level(logging.INFO, logger="helios.access"):
        try:
            runner.run(stack(scope, receive, send))
        except asyncio.CancelledError:
            assert app is cancelled
    lines = [r.getMessage() for r in caplog.records if r.name == "helios.access"]
    assert len(lines) == 1 and lines[0].split()[3] == expected
    assert statuses(metrics) == {expected: 1.0}


# -- the access line's time to first token ----------------------------------------------------------


def test_the_access_line_times_the_first_token_of_any_choice():
    """A request of several choices: its time to first token is its first output token's, whichever
    choice brought it (as `helios_time_to_first_token_seconds` observes it), not its first choice's."""
    record = RequestRecord(arrival_s=100.0, model_name="tiny-chat")
    second = record.choice()
    second.first_token_s, record.first_token_s = 100.25, 101.5  # the second choice's token came first
    line = access_line({"method": "POST", "path": "/v1/completions"}, 200, record)
    assert "ttft_ms=250.0" in line.split(), line

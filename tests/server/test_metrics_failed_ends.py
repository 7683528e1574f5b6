"""/metrics and the access line of requests whose choices failed (the metrics hunt).

- A choice that ends ERROR after its output arrived counts that output in
  ``helios_generated_tokens_total``, as its access line does, whether or not it has stops. A choice
  without stops counted its tokens as they arrived; one with stop strings counts at its end, and its
  end, being a failure, counted none: the same failed request added its tokens to /metrics or not
  depending on whether it asked for a stop.
- The access line of a request of several choices one of which failed writes the failure's reason:
  the response is that failure (JSON: its status and body; a stream: its error event). It wrote the
  first choice's reason (``length`` beside a 500), or ``cancelled`` when the failure's stream ended
  before a sibling's cancel was confirmed.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.server.request_metrics import LatencyHistograms, RequestRecord, event_stamps
from server.test_metrics_invariants import BROKEN_USER, breaking
from support.server_core import SERVED_ID, served_tiny_core

WAIT_S = 60.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny core, whose requests of `BROKEN_USER` fail as their output ends."""
    with served_tiny_core(tmp_path_factory.getbasetemp(), frontend_workers=2) as served:
        served.frontend.prepare_chat = breaking(served.frontend.prepare_chat)
        served.frontend.prepare_completion = breaking(served.frontend.prepare_completion)
        yield served


def generated_tokens(text: str) -> float:
    return next(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == "helios_generated_tokens_total")


@pytest.mark.parametrize("counts_at_end", [False, True], ids=["no-stops", "stops"])
def test_a_failed_choice_counts_the_output_it_was_given(counts_at_end):
    registry = CollectorRegistry()
    histograms = LatencyHistograms(registry)
    record = RequestRecord.now()
    stamp = event_stamps(record, histograms, counts_at_end=counts_at_end)
    stamp(TokenEvent("r", (5, 6), None))
    stamp(TokenEvent("r", (7,), None))
    stamp(FinishEvent("r", FinishReason.ERROR, 4, 3, 0, "output processing failed"))
    assert record.num_output_tokens == 3
    assert registry.get_sample_value("helios_generated_tokens_total") == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_request_with_stops_counts_its_output_as_its_access_line_does(runner, app, served, caplog, stream):
    body = {"model": SERVED_ID, "prompt": "hello world", "max_tokens": 6, "temperature": 0, "stop": ["zzzz"],
            "user": BROKEN_USER, "stream": stream}

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=WAIT_S) as client:
            before = generated_tokens((await client.get("/metrics")).text)
            response = await client.post("/v1/completions", json=body)
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while served.admission.in_use:  # the permit is back once the request's end arrived
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            return response, generated_tokens((await client.get("/metrics")).text) - before

    with caplog.at_level(logging.INFO, logger="helios.access"):
        response, counted = runner.run(scenario())
    assert ("event: error" in response.text) if stream else response.status_code == 500, response.text
    (line,) = [r.getMessage() for r in caplog.records if r.name == "helios.access" and "POST" in r.getMessage()]
    assert "finish=error" in line, line
    logged = int(line.split("completion_tokens=")[1].split()[0])
    assert logged > 0 and counted == logged, line


def ended(record: RequestRecord, reason: FinishReason, num_output_tokens: int) -> None:
    event_stamps(record, LatencyHistograms(CollectorRegistry()))(
        FinishEvent("r", reason, 4, num_output_tokens, 0, ""))


@pytest.mark.parametrize("failure", [FinishReason.ERROR, FinishReason.REJECTED], ids=["error", "rejected"])
def test_the_line_of_a_request_whose_later_choice_failed_writes_the_failure(failure):
    """JSON: the first choice finished, the second failed (the response is its status)."""
    record = RequestRecord(arrival_s=1.0)
    second = record.choice()
    ended(record, FinishReason.LENGTH, 3)
    ended(second, failure, 0)
    assert record.logged_totals()[2] == failure.name.lower()


def test_the_line_of_a_stream_that_a_failure_ended_writes_the_failure_not_its_sibling_cut():
    """A stream: the first choice failed, which ended the stream (its error event) and cancelled the
    second, whose end the engine had not confirmed when the line was written."""
    record = RequestRecord(arrival_s=1.0)
    second = record.choice()
    record.prompt_len = second.prompt_len = 4
    ended(record, FinishReason.ERROR, 2)
    second._num_arrived_tokens = 2
    assert record.logged_totals() == (4, 4, "error")

"""The access line of a stream whose client leaves mid-way (in-process app over the tiny core).

A stream ends as soon as its client is gone (`helios.server.responses.stream_leased`), and the access
log writes its line then; the engine's confirmation of the cancel arrives later. The line was
written with status 200 and no tokens and no finish reason: the choice's record is stamped only by
its end. It now carries the prompt, the output tokens that had arrived and ``finish=cancelled``
(the end the response's close asked for, as the JSON path logs it once the engine confirms).

To make "the end arrives after the line" certain, the request's consumer holds its `FinishEvent`
back until the line is written, then hands it on so the permit is released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading

import pytest

from prometheus_client import CollectorRegistry

from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.server.access import RECORD_KEY, access_line
from helios.server.request_metrics import LatencyHistograms, RequestRecord, event_stamps
from support.asgi_scope import post_scope
from support.server_core import SERVED_ID

WAIT_S = 60.0


class HeldEnd:
    """A request's output consumer that passes every event on except its end, held until `release`
    (an end arriving after that passes at once)."""

    def __init__(self, consumer):
        self._consumer = consumer
        self._lock = threading.Lock()
        self._finish: FinishEvent | None = None
        self._is_released = False

    def on_event(self, event) -> None:
        if isinstance(event, FinishEvent):
            with self._lock:
                if not self._is_released:
                    self._finish = event
                    return
        self._consumer.on_event(event)

    def on_failure(self, error, event) -> None:
        self._consumer.on_failure(error, event)

    def release(self) -> None:
        with self._lock:
            self._is_released, finish = True, self._finish
        if finish is not None:
            self._consumer.on_event(finish)


@pytest.fixture
def held(served, monkeypatch):
    """The `HeldEnd` of each request registered while the test runs."""
    consumers: list[HeldEnd] = []
    register = served.output.register

    def holding(request_id, consumer):
        consumers.append(HeldEnd(consumer))
        register(request_id, consumers[-1])

    monkeypatch.setattr(served.output, "register", holding)
    return consumers


async def leave_after_first_step(app, body: dict) -> dict:
    """Runs the streamed `body` through the ASGI app with a client that leaves once the first body
    message after the start arrived; returns the scope (its state holds the access log's record)."""
    payload = json.dumps(body).encode()
    scope = post_scope("/v1/completions", payload)
    requested, gone = asyncio.Event(), asyncio.Event()

    async def receive():
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()

    await asyncio.wait_for(app(scope, receive, send), WAIT_S)
    return scope


async def released(served, held: list[HeldEnd]) -> None:
    for consumer in held:
        consumer.release()
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while served.admission.in_use:
        assert asyncio.get_running_loop().time() < deadline, "the permit was never released"
        await asyncio.sleep(0.01)


def test_a_stream_cut_by_its_client_logs_its_tokens_so_far_and_cancelled(runner, app, served, held, caplog):
    caplog.set_level(logging.INFO, logger="helios.access")
    body = {"model": SERVED_ID, "prompt": "hello there", "max_tokens": 64, "temperature": 0, "stream": True}
    scope = runner.run(leave_after_first_step(app, body))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "helios.access"]
    record: RequestRecord = scope["state"][RECORD_KEY]
    runner.run(released(served, held))
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert '"POST /v1/completions" 200' in line, line
    assert fields.get("finish") == "cancelled", line
    assert int(fields["prompt_tokens"]) == record.num_prompt_tokens > 0, line  # the engine's count, once it ended
    assert 1 <= int(fields["completion_tokens"]) <= 64, line


def test_the_line_of_a_cut_request_of_several_choices_counts_each_prompt_once():
    """A cut choice counts its prompt (once per prompt, as usage does) and the tokens that arrived;
    a choice that ended counts as it ended; the request's reason is ``cancelled``."""
    histograms = LatencyHistograms(CollectorRegistry())
    record = RequestRecord.now()
    other, third = record.choice(0), record.choice(1)
    for r, prompt_len in ((record, 5), (other, 5), (third, 7)):
        r.prompt_len = prompt_len
    stamps = [event_stamps(r, histograms) for r in (record, other, third)]
    stamps[0](TokenEvent("a", (1, 2), None))
    stamps[1](TokenEvent("b", (3,), None))
    stamps[1](FinishEvent("b", FinishReason.LENGTH, 5, 4, 0))
    stamps[2](TokenEvent("c", (4, 5, 6), None))
    line = access_line({"path": "/v1/completions", "method": "POST"}, 200, record)
    assert "prompt_tokens=12 completion_tokens=9 finish=cancelled choices=3" in line, line
    stamps[0](FinishEvent("a", FinishReason.CANCELLED, 5, 2, 0))
    stamps[2](FinishEvent("c", FinishReason.CANCELLED, 7, 3, 0))
    line = access_line({"path": "/v1/completions", "method": "POST"}, 200, record)
    assert "prompt_tokens=12 completion_tokens=9 finish=cancelled choices=3" in line, line

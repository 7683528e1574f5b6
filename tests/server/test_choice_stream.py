"""The SSE stream of several choices (`ChoicesSSEResponse`): the start and the last message go
through the middlewares and the writes in between to the server's own send; every choice's chunks
accumulate to the JSON response of the same request; a client that disconnects mid-stream, a
client that stops reading (send deadline) and a presentation failure each end the response and
free every choice's request and permit; the failure with exactly one ``event: error``."""

from __future__ import annotations

import asyncio
import json

import pytest

from helios.frontend.responses.presentation import StreamPresenter
from helios.server.app import create_app
from helios.server.responses import TRANSPORT_SEND
from support.asgi_scope import post_scope
from support.server_core import SERVED_ID, served_tiny_core
from test_slow_reader import accumulated, eventually, post  # tests/server is on sys.path (no package)

WAIT_S = 60.0
N = 3
PAYLOAD = {"model": SERVED_ID, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
           "prompt": [5, 9, 14, 3, 22], "n": N}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 8, frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


async def stream(app, payload: dict, *, disconnect_after: int | None = None, pause=None) -> list[tuple[str, dict]]:
    """Streams `payload` through `app`: every message in order, tagged "chain" (the middlewares'
    send) or "transport" (the scope's `TRANSPORT_SEND`). `pause(n)` is awaited by the transport
    send before its n-th message is recorded. After `disconnect_after` body messages the client is
    gone: `receive` says so and every later write waits forever, so the response can end only by
    noticing the disconnect."""
    body = json.dumps({**payload, "stream": True}).encode()
    path = "/v1/completions"
    scope = post_scope(path, body)
    messages: list[tuple[str, dict]] = []
    requested, gone = asyncio.Event(), asyncio.Event()

    async def receive():
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    def recording(tag: str):
        async def send(message):
            if gone.is_set():  # a dead connection: the write never completes, the disconnect ends it
                await asyncio.Event().wait()
            if tag == "transport" and pause is not None:
                await pause(sum(t == "transport" for t, _ in messages))
            messages.append((tag, message))
            bodies = [m for _, m in messages if m["type"] == "http.response.body"]
            if disconnect_after is not None and len(bodies) == disconnect_after:
                gone.set()
        return send

    scope[TRANSPORT_SEND] = recording("transport")
    await asyncio.wait_for(app(scope, receive, recording("chain")), WAIT_S)
    return messages


def text_of(messages) -> str:
    return b"".join(m.get("body", b"") for _, m in messages if m["type"] == "http.response.body").decode()


def by_choice(messages) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in text_of(messages).split("\n"):
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                out.setdefault(choice["index"], []).append({**chunk, "choices": [choice]})
    return out


async def freed(served) -> None:
    await eventually(lambda: served.admission.in_use == 0)
    assert served.engine.scheduler.counters().num_running == 0


def test_choices_stream_below_the_middlewares_equals_the_json_response(runner, app, served):
    payload = {**PAYLOAD, "stream_options": {"include_usage": True}}
    reference = runner.run(post(app, "/v1/completions", PAYLOAD))
    messages = runner.run(stream(app, payload))
    start, *steps, last = messages
    assert start[0] == "chain" and start[1]["type"] == "http.response.start" and start[1]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start[1]["headers"]
    assert last[0] == "chain" and last[1]["more_body"] is False and last[1]["body"].endswith(b"data: [DONE]\n\n")
    assert steps and all(tag == "transport" and m["more_body"] for tag, m in steps)
    chunks = [json.loads(line[6:]) for line in text_of(messages).split("\n") if line.startswith("data: {")]
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}  # one response id for every choice
    usage = [chunk for chunk in chunks if not chunk["choices"]]
    assert len(usage) == 1  # one merged usage chunk; the stream ran second: the cache may serve it the prompt
    assert usage[0]["usage"] == {**reference["usage"], "prompt_tokens_details": usage[0]["usage"]["prompt_tokens_details"]}
    per_choice = by_choice(messages)
    assert sorted(per_choice) == list(range(N))
    for index, entry in enumerate(reference["choices"]):
        state = accumulated(per_choice[index], is_chat=False)
        assert state["text"] == entry["text"] and state["token_ids"] == entry["token_ids"]
        assert state["finish"] == [entry["finish_reason"]]
    runner.run(freed(served))


def test_a_client_that_disconnects_mid_choices_stream_frees_every_choice(runner, app, served):
    messages = runner.run(stream(app, {**PAYLOAD, "max_tokens": 200}, disconnect_after=1))
    assert not any(m.get("more_body") is False for _, m in messages)  # no end: the client is gone
    runner.run(freed(served))


def test_a_choices_stream_whose_client_stops_reading_ends_at_the_send_timeout(runner, served):
    async def stalled(n: int) -> None:
        if n >= 1:  # the client stops reading: this write never completes
            await asyncio.Event().wait()

    timeout_s, served.send_timeout_s = served.send_timeout_s, 0.3
    try:
        messages = runner.run(stream(create_app(served), {**PAYLOAD, "max_tokens": 48}, pause=stalled))
    finally:
        served.send_timeout_s = timeout_s
    assert not any(m.get("more_body") is False for _, m in messages)  # dropped, never ended
    runner.run(freed(served))


def test_a_presentation_failure_ends_the_choices_stream_with_one_error(runner, app, served, monkeypatch):
    run_chunks = StreamPresenter.run_chunks
    calls = []

    def failing(self, run):
        calls.append(run)
        if len(calls) == 2:
            raise ValueError("broken chunk")
        return run_chunks(self, run)

    monkeypatch.setattr(StreamPresenter, "run_chunks", failing)
    messages = runner.run(stream(app, {**PAYLOAD, "max_tokens": 48}))
    text = text_of(messages)
    assert text.count("event: error") == 1 and "presentation failed: broken chunk" in text
    assert "[DONE]" not in text and messages[-1][1]["more_body"] is False
    runner.run(freed(served))


def test_a_shutdown_interrupt_ends_the_choices_stream_with_one_error(runner, app, served):
    async def interrupted(n: int) -> None:
        if n == 1:
            assert served.interrupt_responses() >= 1

    try:
        messages = runner.run(stream(app, {**PAYLOAD, "max_tokens": 48}, pause=interrupted))
    finally:
        served._is_dropping = False
    text = text_of(messages)
    assert text.count("event: error") == 1 and "server shutting down" in text and "[DONE]" not in text
    runner.run(freed(served))

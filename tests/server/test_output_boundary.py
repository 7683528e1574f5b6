"""Output work off the model worker, over the HTTP app and a real tiny core.

A request's output processor is made slow (or broken) by gating its `feed` on an event the test
sets: the model worker must go on stepping every request meanwhile. Progress is read from the
engine (finished requests, generated tokens, running lanes), never from clocks; waits are bounded
only so that a broken build fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from helios.frontend.session import PreparedRequest
from helios.server.app import create_app
from helios.server.bridge import ResponseBridge
from support.server_core import SERVED_ID, served_tiny_core

WAIT_S = 60.0
SLOW = (41, 42, 43, 44)  # prompts whose output processor the test controls
QUICK = (51, 52, 53, 54)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2, output_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


async def post(app, path: str, payload: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await client.post(path, json=payload)


async def eventually(predicate, timeout: float = WAIT_S) -> None:
    """Waits (yielding to the event loop) until `predicate()` holds; fails after `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


def finished(served, reason: str) -> int:
    return served.stats().requests_finished.get(reason, 0)


def sse_data(raw: bytes) -> list[dict]:
    """The JSON data of each SSE event, parsed as a client does."""
    return [json.loads(line[6:]) for line in raw.decode().split("\n") if line.startswith("data: {")]


def body(prompt, max_tokens: int, **fields) -> dict:
    return {"model": SERVED_ID, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0, **fields}


class Gate:
    """Makes the output processor of `SLOW` requests wait in `feed` until `release`, or raise."""

    def __init__(self, monkeypatch, error: Exception | None = None):
        self.entered = threading.Event()
        self.request_ids: list[str] = []
        self._open = threading.Event()
        self._error = error
        create = PreparedRequest.new_output

        def new_output(prepared):
            output = create(prepared)
            if tuple(prepared.prompt_token_ids) == SLOW:
                self.request_ids.append(prepared.request_id)
                output.feed = self._gated(output.feed)
            return output

        monkeypatch.setattr(PreparedRequest, "new_output", new_output)

    def _gated(self, feed):
        def gated(*args):
            self.entered.set()
            if self._error is not None:
                raise self._error
            assert self._open.wait(WAIT_S), "the test never released the output processor"
            return feed(*args)
        return gated

    def release(self) -> None:
        self._open.set()


def text_of(response) -> tuple[str, str, int]:
    data = response.json()
    return data["choices"][0]["text"], data["choices"][0]["finish_reason"], data["usage"]["completion_tokens"]


def test_a_slow_output_processor_does_not_hold_other_requests_steps(runner, app, served, monkeypatch):
    reference = [runner.run(post(app, "/v1/completions", body(p, 8))) for p in (SLOW, QUICK)]
    gate = Gate(monkeypatch)

    async def scenario():
        before, tokens = finished(served, "length"), served.stats().generated_tokens
        slow = asyncio.ensure_future(post(app, "/v1/completions", body(SLOW, 8, stream=True)))
        await eventually(gate.entered.is_set, WAIT_S)  # stuck in its first token's output work
        quick = asyncio.ensure_future(post(app, "/v1/completions", body(QUICK, 8)))
        # Both requests run every step to their limit while the slow one's output is still blocked.
        await eventually(lambda: finished(served, "length") == before + 2, WAIT_S)
        assert served.stats().generated_tokens == tokens + 8 + 8
        assert served.engine.scheduler.counters().num_running == 0 and not slow.done()
        gate.release()
        return await slow, await quick

    slow, quick = runner.run(scenario())
    assert text_of(quick) == text_of(reference[1])
    events = sse_data(slow.content)
    assert "".join(e["choices"][0]["text"] for e in events) == text_of(reference[0])[0]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def stop_case(runner, app) -> tuple[str, tuple[str, str, int]]:
    """A stop string in the middle of the greedy output of `SLOW`, and the ungated response to it."""
    text = text_of(runner.run(post(app, "/v1/completions", body(SLOW, 24))))[0]
    position = next(p for p in range(len(text) // 3, len(text)) if text[p] not in text[:p] and text[p].strip())
    stop = text[position]
    expected = text_of(runner.run(post(app, "/v1/completions", body(SLOW, 24, stop=[stop]))))
    assert expected[0] == text[:position] and expected[1] == "stop" and expected[2] < 24
    return stop, expected


@pytest.mark.parametrize("max_tokens", [24, None], ids=["engine-still-running", "engine-already-ended"])
def test_a_stop_found_late_ends_the_request_at_the_stop(runner, app, served, monkeypatch, max_tokens):
    """The engine runs ahead of a blocked output processor; the stop it then finds ends the request
    exactly where an unblocked run ends it: same text, reason and usage; later tokens never shown
    or counted, and the engine counts the request as stopped."""
    stop, expected = stop_case(runner, app)
    num_stop = expected[2]
    limit = max_tokens or num_stop + 2  # None: the engine reaches its limit before it hears of the stop
    gate = Gate(monkeypatch)

    async def scenario():
        stops, tokens = finished(served, "stop"), served.stats().generated_tokens
        call = asyncio.ensure_future(post(app, "/v1/completions", body(SLOW, limit, stop=[stop])))
        await eventually(gate.entered.is_set, WAIT_S)
        request_id = gate.request_ids[-1]

        def ran_past_the_stop() -> bool:
            view = served.engine.scheduler.view(request_id)
            return view is None or len(view.output_ids) >= num_stop + 2

        await eventually(ran_past_the_stop, WAIT_S)
        gate.release()
        response = await call
        await eventually(lambda: served.engine.scheduler.counters().num_running == 0, WAIT_S)
        return response, stops, tokens

    response, stops, tokens = runner.run(scenario())
    assert text_of(response) == expected
    if max_tokens is not None:  # the stop-matched command ended it
        assert finished(served, "stop") == stops + 1
        assert served.stats().generated_tokens == tokens + num_stop


def test_cancel_while_output_work_is_queued(runner, app, served, monkeypatch):
    gate = Gate(monkeypatch)

    async def scenario():
        cancelled = finished(served, "cancelled")
        call = AsgiStream(app, "/v1/completions", body(SLOW, 60, stream=True))
        await eventually(gate.entered.is_set, WAIT_S)
        call.disconnect()
        await eventually(lambda: finished(served, "cancelled") == cancelled + 1, WAIT_S)
        assert served.engine.scheduler.counters().num_running == 0
        assert served.admission.in_use == 1  # the permit waits for the terminal item
        gate.release()
        await asyncio.wait_for(call.task, WAIT_S)
        await eventually(lambda: served.admission.in_use == 0, WAIT_S)

    runner.run(scenario())
    assert runner.run(post(app, "/v1/completions", body(QUICK, 2))).status_code == 200


@pytest.mark.parametrize("escapes", [False, True], ids=["processor", "bridge"])
def test_an_output_failure_ends_only_its_request_with_a_clear_error(runner, app, served, monkeypatch, escapes):
    """The processor raises (caught by the bridge), or the bridge itself raises (caught by the
    output worker): that request fails with an execution error naming the cause; the request beside
    it completes."""
    reference = text_of(runner.run(post(app, "/v1/completions", body(QUICK, 6))))
    gate = Gate(monkeypatch, RuntimeError("detokenizer exploded"))
    if escapes:
        feed = ResponseBridge._feed

        def escaping(bridge, event):
            if bridge.request_id in gate.request_ids:
                raise RuntimeError("bridge exploded")
            return feed(bridge, event)

        monkeypatch.setattr(ResponseBridge, "_feed", escaping)

    async def scenario():
        cancelled = finished(served, "cancelled")
        failing = asyncio.ensure_future(post(app, "/v1/completions", body(SLOW, 40)))
        quick = asyncio.ensure_future(post(app, "/v1/completions", body(QUICK, 6)))
        results = await failing, await quick
        await eventually(lambda: finished(served, "cancelled") == cancelled + 1, WAIT_S)
        return results

    failing, quick = runner.run(scenario())
    assert failing.status_code == 500
    error = failing.json()["error"]
    cause = "bridge exploded" if escapes else "detokenizer exploded"
    assert error["type"] == "execution_error" and error["message"] == f"output processing failed: RuntimeError: {cause}"
    assert quick.status_code == 200 and text_of(quick) == reference
    assert served.is_healthy and served.admission.in_use == 0


class AsgiStream:
    """One POST through the ASGI interface whose client can go away (`disconnect`)."""

    def __init__(self, app, path: str, payload: dict):
        self._body, self._is_sent = json.dumps(payload).encode(), False
        self._gone = asyncio.Event()
        self.chunks: list[bytes] = []
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    def disconnect(self) -> None:
        self._gone.set()

    async def _receive(self):
        if not self._is_sent:
            self._is_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message) -> None:
        if self._gone.is_set():
            raise OSError("client gone")
        self.chunks.append(message.get("body", b""))

"""The model worker in its engine process (as `helios serve` runs it) stopped, slow, or killed,
seen through the app.

An engine process stopped by SIGSTOP reads no command: the serving process's writes to its pipe
would block once the pipe is full, and they are made on the event loop (submissions, a client's
cancel). Here the serving end's send buffer is shrunk so a few requests fill it; `/health`,
`/metrics` and new requests must still be answered, a client that leaves meanwhile is cancelled
once the engine reads again, and after SIGCONT every request completes and every permit comes
back. A killed engine process ends the requests it held with one error (a stream: one error event)
and every request after that is a 503. States and counters are asserted, never times; a bounded
wait fails a test that would otherwise hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import pytest

from helios.runtime.engine_link import unread_bytes
from helios.server.app import create_app
from support.engine_served import HANG_GUARD_S, asgi_client, shrink_send_buffer, start_served
from support.server_core import SERVED_ID, tiny_core

REQUESTS = 24  # each command ~0.5 KiB: several times what the shrunk pipe holds




@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def served(core):
    """One engine process for the module: the stopped one resumes and serves on, then the last test
    kills it."""
    # no C++ CPU kernels: their load costs seconds of CPU, and what is checked here does not depend on them
    # (test_server's server loads them as `helios serve` does by default)
    served = start_served(core, queue_capacity=REQUESTS + 4, cpu_kernels=False)
    yield served
    served.shutdown()




def chat(**fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], **fields}


async def eventually(predicate, timeout: float = HANG_GUARD_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def run_guarded(scenario, on_hang) -> object:
    """Runs the coroutine `scenario()` on an event loop of its own thread; if that loop is still
    busy after `HANG_GUARD_S` (blocked: nothing else can end it), calls `on_hang()` (which lets it
    end) and fails."""
    outcome = {}

    def run() -> None:
        try:
            outcome["value"] = asyncio.run(scenario())
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    if thread.is_alive():
        on_hang()
        thread.join(HANG_GUARD_S)
        pytest.fail("the event loop was blocked: the serving process waited on the engine process")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]




def test_an_engine_process_that_stops_reading_never_blocks_the_event_loop(served):
    """Before: the event loop wrote each submission to the engine process's pipe itself; with the
    engine process stopped, the write that found the pipe full blocked the loop, so /health,
    /metrics and every connection hung until the engine process read again."""
    app = create_app(served)
    pid = served.engine._process.pid
    connection = served.engine._connection
    shrink_send_buffer(connection)
    stopped = False

    async def scenario():
        nonlocal stopped
        async with asgi_client(app) as c:
            assert (await c.post("/v1/chat/completions", json=chat(max_tokens=2))).status_code == 200
            cancelled = served.stats().requests_finished.get("cancelled", 0)
            os.kill(pid, signal.SIGSTOP)
            stopped = True
            leaving = asyncio.ensure_future(c.post("/v1/chat/completions", json=chat(max_tokens=200)))
            requests = [asyncio.ensure_future(c.post("/v1/completions", json={
                "model": SERVED_ID, "prompt": [3 + k] * 250, "max_tokens": 2, "temperature": 0}))
                for k in range(REQUESTS)]
            await eventually(lambda: served.admission.in_use == REQUESTS + 1 and unread_bytes(connection) > 0
                             and served.commands.num_queued > 0)  # the pipe is full: commands wait
            health, metrics = await c.get("/health"), await c.get("/metrics")
            models = await c.get("/v1/models")
            leaving.cancel()  # its client leaves while the engine process reads nothing
            await asyncio.gather(leaving, return_exceptions=True)
            assert not any(task.done() for task in requests)
            os.kill(pid, signal.SIGCONT)
            stopped = False
            done = await asyncio.gather(*requests)
            await eventually(lambda: served.admission.in_use == 0 and served.commands.num_queued == 0)
            await eventually(lambda: served.stats().requests_finished.get("cancelled", 0) == cancelled + 1)
            later = await c.post("/v1/chat/completions", json=chat(max_tokens=2, stream=True))
            return health, metrics, models, done, later

    def resume() -> None:
        if stopped:
            os.kill(pid, signal.SIGCONT)

    try:
        health, metrics, models, done, later = run_guarded(scenario, resume)
    finally:
        resume()
    assert health.status_code == 200 and models.status_code == 200
    assert metrics.status_code == 200 and f"helios_admission_permits_in_use {REQUESTS + 1}.0" in metrics.text
    assert all(response.status_code == 200 for response in done), [r.text for r in done if r.status_code != 200]
    assert [response.json()["choices"][0]["finish_reason"] for response in done] == ["length"] * REQUESTS
    assert later.status_code == 200 and later.text.rstrip().endswith("data: [DONE]")


class StreamCall:
    """A streamed chat request driven through the ASGI interface: its body chunks as they come."""

    def __init__(self, app, body: dict):
        self.chunks: list[bytes] = []
        self.started = asyncio.Event()
        self._body = json.dumps(body).encode()
        self._is_sent = False
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
            "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1234), "server": ("127.0.0.1", 80),
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict:
        if not self._is_sent:
            self._is_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await asyncio.Event().wait()  # the client stays

    async def _send(self, message: dict) -> None:
        if message.get("body"):
            self.chunks.append(message["body"])
            self.started.set()


def test_a_killed_engine_process_ends_what_it_held_and_every_later_request_is_a_503(served):
    """The module's engine process (its pipe still shrunk by the test before), last: killed here."""
    app = create_app(served)

    async def scenario():
        async with asgi_client(app) as c:
            streaming = StreamCall(app, chat(max_tokens=200, temperature=0, stream=True))
            await streaming.started.wait()  # httpx's ASGI transport hands over a body only once it ended
            await eventually(lambda: served.stats().generated_tokens > 0)
            held = asyncio.ensure_future(c.post("/v1/chat/completions", json=chat(max_tokens=200)))
            await eventually(lambda: served.admission.in_use == 2)
            served.engine._process.kill()
            await streaming.task
            held = await held
            await eventually(lambda: not served.is_healthy)
            later = [await c.post("/v1/chat/completions", json=body) for body in (
                chat(max_tokens=2), chat(max_tokens=2, stream=True), chat(max_tokens=2, n=2))]
            completion = await c.post("/v1/completions", json={"model": SERVED_ID, "prompt": "hi", "max_tokens": 2})
            lines = b"".join(streaming.chunks).decode().split("\n")
            return lines, held, [*later, completion], await c.get("/health"), await c.get("/metrics")

    try:
        lines, held, later, health, metrics = run_guarded(scenario, lambda: None)
    finally:
        served.shutdown()
    events = [line for line in lines if line.startswith("event: ")]
    assert events == ["event: error"] and "data: [DONE]" not in lines, lines[-4:]
    error = json.loads(lines[lines.index("event: error") + 1][len("data: "):])["error"]
    assert error["code"] == 500 and "model worker died" in error["message"]
    assert held.status_code == 500 and "model worker died" in held.json()["error"]["message"]
    for response in later:
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["type"] == "server_shutting_down" and error["code"] == 503
        assert "model worker died" in error["message"] and "Traceback" not in response.text
    assert health.status_code == 503 and "helios_healthy 0.0" in metrics.text
    assert served.admission.in_use == 0

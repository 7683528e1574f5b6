"""Overload and request faults through the app over a real tiny core and a running model worker.

More concurrent requests than admission permits, requests of more choices than there are permits,
choices whose pages exceed the cache, prompts at and past the context extent, clients that leave
while queued, mid-prefill or mid-stream, a preparation that raises an unexpected exception, and
every route with every method. Each fault gets its status and a typed OpenAI-style error body, and
afterwards every permit, slot and cache page is back and the worker serves on. States and
counters are asserted, never times: a step or a preparation is held at a gate (a
`threading.Event`) while the test acts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import httpx
import pytest

from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions
from helios.server.app import create_app
from support.server_core import CONTEXT_TOKENS, SERVED_ID, served_tiny_core

QUEUE_CAPACITY = 2
GATE_S = 120.0  # a gate that nobody opens fails its test instead of hanging it


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), QUEUE_CAPACITY, frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


def chat(content: str = "hello", **fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": content}], **fields}


def client(app) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120)


async def post(app, path: str, body: dict) -> httpx.Response:
    async with client(app) as c:
        return await c.post(path, json=body)


async def eventually(predicate, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def assert_error(response: httpx.Response, status: int, error_type: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["type"] == error_type and error["param"] == param, error
    assert "Traceback" not in error["message"] and 'File "' not in error["message"]
    return error


def finished(served, reason: str) -> int:
    return served.stats().requests_finished.get(reason, 0)


def assert_idle(served) -> None:
    """Nothing held: no permit, no engine request, every page free or cached."""
    stats = served.stats()
    assert served.admission.in_use == 0
    assert stats.active_requests == 0 and stats.queued_requests == 0
    assert stats.pages_free + stats.pages_cached == stats.pages_total, stats


class Gate:
    """Holds every call of `target.name` at a gate until `open()`; `entered` counts the calls."""

    def __init__(self, monkeypatch, target, name: str):
        self._opened = threading.Event()
        self._lock = threading.Lock()
        self.entered = 0
        original = getattr(target, name)

        def held(*args, **kwargs):
            with self._lock:
                self.entered += 1
            assert self._opened.wait(GATE_S), "the gate was never opened"
            return original(*args, **kwargs)

        monkeypatch.setattr(target, name, held)

    def open(self) -> None:
        self._opened.set()


class AsgiCall:
    """One POST driven through the ASGI interface; `disconnect()` makes its client go away."""

    def __init__(self, app, path: str, body: dict):
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.started = asyncio.Event()  # the first body chunk arrived
        self._body = json.dumps(body).encode()
        self._is_sent = False
        self._gone = asyncio.Event()
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1234), "server": ("127.0.0.1", 80),
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    def disconnect(self) -> None:
        self._gone.set()

    async def _receive(self) -> dict:
        if not self._is_sent:
            self._is_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        if self._gone.is_set():
            return
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            self.chunks.append(message["body"])
            self.started.set()


# -- admission -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_more_concurrent_requests_than_permits_get_429_each_and_every_permit_comes_back(runner, app, served,
                                                                                      monkeypatch, stream):
    """Requests held in preparation hold their permits: each one past them is a 429 (type
    overloaded), /health and /metrics answer meanwhile, the admitted ones then complete."""
    permits = served.admission.limits.num_permits
    gate = Gate(monkeypatch, served.frontend, "prepare_chat")

    async def scenario():
        async with client(app) as c:
            admitted = [asyncio.ensure_future(c.post("/v1/chat/completions", json=chat(max_tokens=2, stream=stream)))
                        for _ in range(permits)]
            await eventually(lambda: served.admission.in_use == permits)
            extra = await asyncio.gather(*(c.post("/v1/chat/completions", json=chat(max_tokens=2, stream=stream))
                                           for _ in range(3)))
            choices = await c.post("/v1/completions", json={"model": SERVED_ID, "prompt": "hi", "n": 2})
            health, metrics = await c.get("/health"), await c.get("/metrics")
            assert served.admission.in_use == permits and not any(task.done() for task in admitted)
            gate.open()
            return extra, choices, health, metrics, await asyncio.gather(*admitted)

    extra, choices, health, metrics, done = runner.run(scenario())
    for response in (*extra, choices):
        error = assert_error(response, 429, "overloaded")
        assert f"{permits} admitted requests" in error["message"]
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert f"helios_admission_permits_in_use {permits}.0" in metrics.text
    assert 'helios_http_responses_total{endpoint="chat",status="429"} 3.0' in metrics.text or stream
    for response in done:
        assert response.status_code == 200, response.text
        assert not stream or response.text.rstrip().endswith("data: [DONE]")
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert_idle(served)


@pytest.mark.parametrize("fields, param", [
    ({"prompt": "hi", "n": 16}, "n"),
    ({"prompt": ["a", "b", "c", "d"], "n": 4}, "n"),
    ({"prompt": ["p"] * 16}, "prompt"),
])
def test_a_request_of_more_choices_than_there_are_permits_is_400_not_a_429_no_retry_gets_past(runner, app, served,
                                                                                            fields, param):
    """Before: 429 "retry later", which no retry could ever get past (each choice takes a permit,
    all at once, and the server has fewer)."""
    permits = served.admission.limits.num_permits
    assert permits < 16
    response = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "max_tokens": 1, **fields}))
    error = assert_error(response, 400, "invalid_request_error", param)
    assert f"at most {permits} at once" in error["message"]
    assert served.admission.in_use == 0
    fits = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": "hi", "max_tokens": 1, "n": permits}))
    assert fits.status_code == 200 and len(fits.json()["choices"]) == permits


def test_choices_take_their_permits_all_at_once_or_none(runner, app, served):
    permits = served.admission.limits.num_permits
    held = [served.admission.acquire() for _ in range(permits - 2)]
    try:
        response = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": "hi", "max_tokens": 1,
                                                            "n": 3}))
        assert_error(response, 429, "overloaded")
        assert served.admission.in_use == permits - 2
        fits = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": "hi", "max_tokens": 1, "n": 2}))
        assert fits.status_code == 200, fits.text
    finally:
        for permit in held:
            permit.release()
    assert served.admission.in_use == 0


# -- the context extent and the cache ----------------------------------------------------------------


def test_prompts_at_and_one_past_the_context_extent(runner, app, served):
    fits = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": [5] * (CONTEXT_TOKENS - 1),
                                                    "max_tokens": 1}))
    assert fits.status_code == 200 and fits.json()["usage"]["prompt_tokens"] == CONTEXT_TOKENS - 1
    for length in (CONTEXT_TOKENS, CONTEXT_TOKENS + 1):
        for extra in ({}, {"max_tokens": 1}, {"stream": True}):
            response = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": [5] * length, **extra}))
            error = assert_error(response, 400, "invalid_request_error", "prompt")
            assert f"context extent is {CONTEXT_TOKENS} tokens" in error["message"]
    over = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": [5] * (CONTEXT_TOKENS - 1),
                                                    "max_tokens": 2}))
    error = assert_error(over, 400, "invalid_request_error", "max_tokens")
    assert f"context extent of {CONTEXT_TOKENS} tokens" in error["message"]
    assert_idle(served)


def test_choices_whose_pages_exceed_the_cache_all_complete(runner, tmp_path_factory):
    """A cache of one request's pages (16): 8 choices of a 200-token prompt with 50 tokens each
    need many times that; they take turns (preempted, recomputed) instead of stalling."""
    options = RuntimeOptions(LoadOptions(num_pages=16), queue_capacity=4)
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, runtime_options=options, frontend_workers=2) as small:
        assert small.stats().pages_total == 16
        body = {"model": SERVED_ID, "prompt": list(range(3, 203)), "max_tokens": 50, "n": 8, "temperature": 1}
        for stream in (False, True):
            response = runner.run(post(create_app(small), "/v1/completions", {**body, "stream": stream}))
            assert response.status_code == 200, response.text
            if stream:
                assert response.text.rstrip().endswith("data: [DONE]") and "event: error" not in response.text
            else:
                assert len(response.json()["choices"]) == 8
        runner.run(eventually(lambda: small.admission.in_use == 0))
        assert_idle(small)


# -- clients that leave -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_while_queued_for_preparation_releases_everything(runner, app, served, monkeypatch,
                                                                             stream):
    gate = Gate(monkeypatch, served.frontend, "prepare_chat")

    async def scenario():
        cancelled = finished(served, "cancelled")
        calls = [AsgiCall(app, "/v1/chat/completions", chat(max_tokens=200, temperature=0, stream=stream))
                 for _ in range(3)]  # two preparation slots: the third waits for one
        await eventually(lambda: gate.entered == 2 and served.admission.in_use == 3)
        for call in calls:
            call.disconnect()
        gate.open()
        await asyncio.gather(*(call.task for call in calls))
        await eventually(lambda: served.admission.in_use == 0 and finished(served, "cancelled") >= cancelled + 1)

    runner.run(scenario())
    assert_idle(served)
    assert runner.run(post(app, "/v1/chat/completions", chat(max_tokens=2))).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_mid_prefill_or_queued_in_the_engine_releases_its_slot_pages_and_permit(
        runner, app, served, monkeypatch, stream):
    """The first request's prefill is held in its launch; a second one waits in the engine behind
    it. Both clients leave; once the step runs, both end cancelled and nothing stays held."""
    gate = Gate(monkeypatch, served.engine.executor, "launch")

    async def scenario():
        cancelled = finished(served, "cancelled")
        first = AsgiCall(app, "/v1/chat/completions", chat(max_tokens=200, temperature=0, stream=stream))
        await eventually(lambda: gate.entered == 1)  # mid-prefill
        second = AsgiCall(app, "/v1/completions", {"model": SERVED_ID, "prompt": [9] * 40, "max_tokens": 200,
                                                   "stream": stream})
        await eventually(lambda: served.stats().requests_admitted >= 1 and served.admission.in_use == 2)
        first.disconnect()
        second.disconnect()
        gate.open()  # a JSON response waits for the engine to confirm its end
        await asyncio.gather(first.task, second.task)
        await eventually(lambda: served.admission.in_use == 0 and finished(served, "cancelled") == cancelled + 2)

    runner.run(scenario())
    runner.run(eventually(lambda: served.stats().active_requests == 0))
    assert_idle(served)
    assert runner.run(post(app, "/v1/chat/completions", chat(max_tokens=2))).status_code == 200


def test_a_client_that_leaves_mid_stream_releases_its_slot_pages_and_permit(runner, app, served):
    async def scenario():
        cancelled = finished(served, "cancelled")
        call = AsgiCall(app, "/v1/chat/completions", chat(max_tokens=200, temperature=0, stream=True))
        await call.started.wait()
        await eventually(lambda: served.stats().generated_tokens > 0 and served.stats().active_requests == 1)
        call.disconnect()
        await call.task
        await eventually(lambda: served.admission.in_use == 0 and finished(served, "cancelled") == cancelled + 1)

    runner.run(scenario())
    runner.run(eventually(lambda: served.stats().active_requests == 0))
    assert_idle(served)


# -- a fault while preparing -----------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [{}, {"stream": True}, {"n": 2}])
def test_an_unexpected_exception_while_preparing_is_a_generic_500_and_the_server_serves_on(runner, app, served,
                                                                                        monkeypatch, fields):
    secret = "secret-internal-detail /srv/model/path.py line 42"

    def broken(*args, **kwargs):
        raise KeyError(secret)

    monkeypatch.setattr(served.frontend, "prepare_chat", broken)
    response = runner.run(post(app, "/v1/chat/completions", chat(max_tokens=2, **fields)))
    error = assert_error(response, 500, "execution_error")
    assert secret not in response.text and "KeyError" in error["message"]
    assert served.admission.in_use == 0
    monkeypatch.undo()
    assert runner.run(post(app, "/v1/chat/completions", chat(max_tokens=2, **fields))).status_code == 200
    assert_idle(served)


# -- routes and methods -----------------------------------------------------------------------------------

ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET",
          f"/v1/models/{SERVED_ID}": "GET", "/health": "GET", "/metrics": "GET"}


def test_every_route_answers_other_methods_with_a_json_405_naming_the_allowed_method(runner, app):
    async def scenario():
        async with client(app) as c:
            return {(method, path): await c.request(method, path)
                    for path in ROUTES for method in ("HEAD", "OPTIONS", "GET", "POST", "PUT", "DELETE", "PATCH")
                    if method != ROUTES[path]}

    for (method, path), response in runner.run(scenario()).items():
        assert response.status_code == 405, (method, path)
        assert response.headers["allow"] == ROUTES[path], (method, path)
        if method != "HEAD":  # a HEAD answer has no body
            assert_error(response, 405, "invalid_request_error")


@pytest.mark.parametrize("method", ["GET", "POST", "HEAD", "OPTIONS", "DELETE"])
@pytest.mark.parametrize("path", ["/", "/v1", "/v1/chat", "/v2/completions", "/v1/completions/x", "/%ff"])
def test_unknown_routes_are_a_json_404(runner, app, method, path):
    response = runner.run(client_request(app, method, path))
    assert response.status_code == 404
    if method != "HEAD":
        assert_error(response, 404, "invalid_request_error")


async def client_request(app, method: str, path: str) -> httpx.Response:
    async with client(app) as c:
        return await c.request(method, path)


def test_health_and_metrics_answer_while_every_slot_generates(runner, app, served):
    """Every engine slot and permit busy: /health, /metrics and /v1/models still answer at once,
    and /metrics reports the load."""
    permits = served.admission.limits.num_permits

    async def scenario():
        async with client(app) as c:
            running = [asyncio.ensure_future(c.post("/v1/chat/completions",
                                                    json=chat(f"q{k}", max_tokens=200, temperature=0, stream=True)))
                       for k in range(permits)]
            await eventually(lambda: served.admission.in_use == permits and served.stats().active_requests > 0)
            answers = [await c.get(path) for path in ("/health", "/metrics", "/v1/models") for _ in range(5)]
            assert not all(task.done() for task in running)
            return answers, await asyncio.gather(*running)

    answers, streams = runner.run(scenario())
    assert all(answer.status_code == 200 for answer in answers)
    assert any("helios_admission_permits_in_use" in answer.text for answer in answers)
    assert all(stream.text.rstrip().endswith("data: [DONE]") for stream in streams)
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert_idle(served)


def test_a_server_error_is_logged_once_with_its_traceback_and_the_client_sees_none(runner, served, monkeypatch,
                                                                                   caplog):
    """Over uvicorn (as `helios serve` runs): the handler's unexpected exception is one ERROR record
    (uvicorn's, with the traceback) and the client reads the generic 500."""
    import socket

    import uvicorn

    from helios.server.responses import with_transport_send

    def broken(*args, **kwargs):
        raise ZeroDivisionError("hidden detail")

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(with_transport_send(create_app(served)), loop="asyncio", http="httptools",
                            lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert_started(server, thread)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        caplog.set_level(logging.ERROR)
        monkeypatch.setattr(served.frontend, "prepare_chat", broken)
        response = httpx.post(url + "/v1/chat/completions", json=chat(max_tokens=2), timeout=60)
        monkeypatch.undo()
        error = assert_error(response, 500, "execution_error")
        assert "hidden detail" not in response.text and error["message"] == "internal error: ZeroDivisionError"
        # uvicorn logs the exception after the response went out
        wait_until(lambda: any(r.levelno >= logging.ERROR for r in caplog.records))
        assert httpx.post(url + "/v1/chat/completions", json=chat(max_tokens=2), timeout=60).status_code == 200
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is not None, [r.getMessage() for r in errors]
        assert errors[0].exc_info[0] is ZeroDivisionError
    finally:
        server.should_exit = True
        thread.join(30)
    assert served.admission.in_use == 0


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def assert_started(server, thread) -> None:
    wait_until(lambda: server.started or not thread.is_alive())
    assert server.started, "the server did not start"


@pytest.mark.parametrize("stream", [False, True])
def test_a_choice_that_fails_at_submission_releases_every_choices_permit(runner, app, served, monkeypatch, stream):
    """Before: the choices submitted before the one that raised kept running with no reader and,
    with the permits of the choices after it, held their permits for good."""
    from helios.frontend.session import PreparedRequest

    request_spec, calls = PreparedRequest.request_spec, []

    def second_fails(self, **scheduling):
        calls.append(self.request_id)
        if len(calls) == 2:
            raise RuntimeError("unexpected")
        return request_spec(self, **scheduling)

    monkeypatch.setattr(PreparedRequest, "request_spec", second_fails)
    body = {"model": SERVED_ID, "prompt": "hi", "max_tokens": 200, "temperature": 0, "n": 4, "stream": stream}
    response = runner.run(post(app, "/v1/completions", body))
    monkeypatch.undo()
    assert_error(response, 500, "execution_error")
    runner.run(eventually(lambda: served.admission.in_use == 0 and served.stats().active_requests == 0))
    assert_idle(served)
    assert runner.run(post(app, "/v1/chat/completions", chat(max_tokens=2))).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_of_several_choices_that_leaves_mid_generation_releases_every_choice(runner, app, served, stream):
    async def scenario():
        cancelled = finished(served, "cancelled")
        body = {"model": SERVED_ID, "prompt": "hi", "max_tokens": 200, "temperature": 0, "n": 4, "stream": stream}
        call = AsgiCall(app, "/v1/completions", body)
        await eventually(lambda: served.stats().generated_tokens > 0 and served.stats().active_requests == 4)
        if stream:
            await call.started.wait()
        call.disconnect()
        await call.task
        await eventually(lambda: served.admission.in_use == 0 and finished(served, "cancelled") == cancelled + 4)

    generated = served.stats().generated_tokens
    runner.run(scenario())
    runner.run(eventually(lambda: served.stats().active_requests == 0))
    assert_idle(served)
    assert served.stats().generated_tokens > generated


def test_a_choice_that_fails_ends_the_other_choices_of_its_json_response(runner, app, served, monkeypatch):
    """Before: the JSON response of several choices waited for every choice's end, so after one
    failed (its answer a 500 whatever the others do) the others generated to their limits,
    holding their slots and permits."""
    from helios.frontend.responses.output import OutputProcessor

    feed, failing = OutputProcessor.feed, []

    def first_fails(self, *args, **kwargs):
        if not failing:
            failing.append(self)
        if self is failing[0]:
            raise UnicodeError("broken detokenizer")
        return feed(self, *args, **kwargs)

    monkeypatch.setattr(OutputProcessor, "feed", first_fails)
    before = dict(served.stats().requests_finished)
    body = {"model": SERVED_ID, "prompt": "hi", "max_tokens": 200, "temperature": 0, "n": 3}
    response = runner.run(post(app, "/v1/completions", body))
    error = assert_error(response, 500, "execution_error")
    assert "output processing failed" in error["message"]
    runner.run(eventually(lambda: served.admission.in_use == 0))
    monkeypatch.undo()
    after = served.stats().requests_finished
    assert after.get("cancelled", 0) == before.get("cancelled", 0) + 3, (before, after)
    assert after.get("length", 0) == before.get("length", 0)
    assert_idle(served)

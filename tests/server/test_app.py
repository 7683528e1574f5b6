"""The HTTP app in-process over a real tiny core: status codes, error bodies, admission permits,
paused readers and disconnects.

Requests go through httpx's ASGI transport, or through `AsgiCall`, which drives one request
straight through the ASGI interface so a test decides when the reader takes body chunks and when
the client disconnects.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.frontend.responses.output import OutputProcessor
from helios.server.app import create_app
from helios.server.schemas import ChatCompletionRequest, CompletionRequest
from support.server_core import NAMESPACE, SERVED_ID, served_tiny_core

QUEUE_CAPACITY = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), QUEUE_CAPACITY, frontend_workers=2,
                          owned_by=NAMESPACE) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


def chat_body(content: str = "hello", **fields) -> dict:
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": content}]}
    body.update(fields)
    return body


async def post(app, path: str, body, **kwargs) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        if isinstance(body, (bytes, str)):
            return await client.post(path, content=body, **kwargs)
        return await client.post(path, json=body, **kwargs)


async def get(app, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await client.get(path)


async def eventually(predicate, timeout: float = 60.0) -> None:
    """Waits (yielding to the event loop) until `predicate()` holds; fails after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


def sse_events(raw: bytes) -> list[tuple[str, str]]:
    """(event name, data) of each SSE event, parsed as a client does."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        events.append((name, "\n".join(data)))
    return events


def finished(served, reason: str) -> int:
    return served.stats().requests_finished.get(reason, 0)


class AsgiCall:
    """One POST driven through the ASGI app. The reader stops taking body chunks after
    `pause_after` of them until `resume()`; `disconnect()` makes the client go away."""

    def __init__(self, app, path: str, body: dict, pause_after: int | None = None):
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.paused = asyncio.Event()
        self._body = json.dumps(body).encode()
        self._is_request_sent = False
        self._pause_after = pause_after
        self._gate = asyncio.Event()
        self._gone = asyncio.Event()
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1234), "server": ("127.0.0.1", 80),
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def resume(self) -> None:
        self._gate.set()

    def disconnect(self) -> None:
        self._gone.set()

    async def _receive(self) -> dict:
        if not self._is_request_sent:
            self._is_request_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        if self._gone.is_set():
            return  # like a server whose client is gone: writes go nowhere
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        self.chunks.append(message.get("body", b""))
        if self._pause_after is not None and len(self.chunks) >= self._pause_after:
            self.paused.set()
            await self._gate.wait()


# -- schema and errors ---------------------------------------------------------------------------


def test_openapi_documents_the_strict_request_models(runner, app):
    document = runner.run(get(app, "/openapi.json")).json()
    schemas = document["components"]["schemas"]
    for path, model in (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest)):
        operation = document["paths"][path]["post"]
        reference = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = schemas[reference.rsplit("/", 1)[1]]
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == {f.alias or name for name, f in model.model_fields.items()}
        assert {"200", "400", "429", "500", "503"} <= set(operation["responses"])
        assert "422" not in operation["responses"]


@pytest.mark.parametrize(
    "body, headers, param",
    [
        (b"{not json", {"content-type": "application/json"}, None),
        (b"[1, 2]", {"content-type": "application/json"}, None),
        (chat_body(logit_bias={"x": 2}), {}, "logit_bias"),
        (chat_body(temperature="hot"), {}, "temperature"),
        (chat_body(messages=[{"role": "wizard", "content": "x"}]), {}, "messages[0]"),
        (chat_body(return_token_timestamps=True), {}, None),
        (chat_body(stop="x", stop_token_ids=[1]), {}, None),
        (chat_body(tool_choice="required"), {}, None),
        (chat_body(stream_options={"include_usage": True}), {}, None),
        (chat_body(stop_token_ids=[10**6]), {}, None),
    ],
)
def test_invalid_requests_are_400_with_openai_error_bodies(runner, app, body, headers, param):
    response = runner.run(post(app, "/v1/chat/completions", body, headers=headers))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"]
    if param is not None:
        assert error["param"].startswith(param)


@pytest.mark.parametrize(
    "fields, ref",
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"loc": {"$ref": "#/$defs/Location"}}}}}]}, "#/$defs/Location"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"loc": {"$ref": "https://example.com/loc.json"}}}}}],
          "tool_choice": "required"}, "https://example.com/loc.json"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
            "$ref": "#/definitions/Node"}}}, "stream": True}, "#/definitions/Node"),
    ],
)
def test_unresolvable_schema_refs_are_400_naming_the_ref(runner, app, fields, ref):
    response = runner.run(post(app, "/v1/chat/completions", chat_body(**fields)))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and f"$ref {ref!r}" in error["message"]


def test_completion_prompt_ids_outside_the_input_range_are_400(runner, app):
    response = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": [1, 10**6]}))
    assert response.status_code == 400 and "prompt token ids" in response.json()["error"]["message"]


def test_full_ingress_is_429_and_counted(runner, app, served):
    held = [served.admission.acquire() for _ in range(served.admission.limits.num_permits)]
    try:
        response = runner.run(post(app, "/v1/chat/completions", chat_body(max_tokens=2)))
    finally:
        for permit in held:
            permit.release()
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "overloaded"
    metrics = runner.run(get(app, "/metrics")).text
    assert 'helios_http_responses_total{endpoint="chat",status="429"}' in metrics
    assert runner.run(post(app, "/v1/chat/completions", chat_body(max_tokens=2))).status_code == 200


def test_request_beyond_the_context_extent_is_400_naming_the_limit(runner, app, served):
    for body in (chat_body(max_tokens=10_000), {**chat_body(max_tokens=10_000), "stream": True}):
        response = runner.run(post(app, "/v1/chat/completions", body))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert f"context extent of {served.card.context_tokens} tokens" in error["message"]
    prompt = list(range(3, 3 + served.card.context_tokens))  # no room left for one output token
    response = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": prompt}))
    assert response.status_code == 400 and "leaves no room for output" in response.json()["error"]["message"]
    fits = runner.run(post(app, "/v1/completions", {"model": SERVED_ID, "prompt": prompt[:-4], "temperature": 0}))
    assert fits.status_code == 200, fits.text  # max_tokens omitted: up to the rest of the context
    assert fits.json()["usage"]["completion_tokens"] <= 4
    assert served.admission.in_use == 0


def test_scheduler_admission_rejection_is_503_or_one_error_event(runner, app, served, monkeypatch):
    from helios.runtime.scheduling import scheduler
    from helios.runtime.scheduling.admission import CacheExceeded

    def no_room(spec, caps):
        raise CacheExceeded(f"request {spec.request_id}: needs more pages than the cache holds")

    monkeypatch.setattr(scheduler, "check_admission", no_room)
    too_long = chat_body(max_tokens=4)
    response = runner.run(post(app, "/v1/chat/completions", too_long))
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "admission_rejected"
    streamed = runner.run(post(app, "/v1/chat/completions", {**too_long, "stream": True}))
    assert streamed.status_code == 200
    events = sse_events(streamed.content)
    assert [name for name, _ in events] == ["message", "error"]  # role chunk, then the one error event
    assert json.loads(events[-1][1])["error"]["type"] == "admission_rejected"
    assert served.is_healthy and served.admission.in_use == 0


def test_execution_failure_is_500_or_one_error_event(runner, app, served, monkeypatch):
    def failing_launch(plan, *, alone=False):
        raise RuntimeError("device lost")

    monkeypatch.setattr(served.engine.executor, "launch", failing_launch)
    response = runner.run(post(app, "/v1/chat/completions", chat_body(max_tokens=4)))
    streamed = runner.run(post(app, "/v1/chat/completions", chat_body(max_tokens=4, stream=True)))
    monkeypatch.undo()
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "execution_error"
    events = sse_events(streamed.content)
    assert events[-1][0] == "error" and json.loads(events[-1][1])["error"]["type"] == "execution_error"
    assert all(data != "[DONE]" for _, data in events)
    assert served.is_healthy  # a failed plan fails its requests, not the worker
    assert runner.run(post(app, "/v1/chat/completions", chat_body(max_tokens=2))).status_code == 200


def test_output_failure_is_500_and_cancels_the_request(runner, app, served, monkeypatch):
    def failing_feed(self, token_id, observed_ns=None):
        raise UnicodeError("broken detokenizer")

    before = dict(served.stats().requests_finished)
    monkeypatch.setattr(OutputProcessor, "feed", failing_feed)
    response = runner.run(post(app, "/v1/chat/completions", chat_body(max_tokens=100)))
    monkeypatch.undo()
    assert response.status_code == 500
    assert "output processing failed" in response.json()["error"]["message"]

    def ended() -> bool:
        """The request ended once: cancelled, unless the engine finished it (its length or EOS)
        before the output worker's failure reached it; its permit is back either way."""
        after = served.stats().requests_finished
        grew = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
        return sum(grew.values()) == 1 and served.admission.in_use == 0

    runner.run(eventually(ended, timeout=10))
    assert finished(served, "cancelled") == before.get("cancelled", 0) + 1 or \
        finished(served, "length") + finished(served, "stop") > before.get("length", 0) + before.get("stop", 0)


# -- permits, paused readers, disconnects --------------------------------------------------------


def test_finished_response_keeps_its_permit_until_the_reader_releases_it(runner, app, served):
    async def scenario():
        before = finished(served, "length")
        # greedy: a sampled reply of this random model can end at EOS before 8 tokens (not "length")
        call = AsgiCall(app, "/v1/chat/completions", chat_body(max_tokens=8, stream=True, temperature=0),
                        pause_after=1)
        await call.paused.wait()
        # the engine is done with the request and gave back its slot (the finish is counted and the
        # slot released as two updates, so both are awaited), but the reader holds the permit
        await eventually(lambda: finished(served, "length") == before + 1 and served.stats().active_requests == 0)
        assert served.admission.in_use == 1
        call.resume()
        await call.task
        assert served.admission.in_use == 0
        return call

    call = runner.run(scenario())
    events = sse_events(call.body)
    assert call.status == 200 and events[-1][1] == "[DONE]"
    assert json.loads(events[-2][1])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", chat_body(max_tokens=4, n=2, temperature=0)),
    ("/v1/completions", {"model": SERVED_ID, "prompt": ["hello", "world"], "max_tokens": 4, "temperature": 0}),
])
def test_a_json_body_of_several_choices_keeps_their_permits_until_the_reader_releases_it(runner, app, served, path,
                                                                                        body):
    """Every choice's permit was given back before the merged body was written: a reader that did
    not take it held an unbounded body outside admission (and no send deadline applied)."""
    async def scenario():
        call = AsgiCall(app, path, body, pause_after=1)
        await call.paused.wait()
        await eventually(lambda: served.stats().active_requests == 0)
        assert served.admission.in_use == 2
        call.resume()
        await call.task
        assert served.admission.in_use == 0
        return call

    call = runner.run(scenario())
    assert call.status == 200 and [c["index"] for c in json.loads(call.body)["choices"]] == [0, 1]


def test_paused_reader_does_not_hold_back_other_responses(runner, app, served):
    async def scenario():
        paused = AsgiCall(app, "/v1/chat/completions", chat_body(max_tokens=40, stream=True), pause_after=2)
        await paused.paused.wait()
        other = await post(app, "/v1/chat/completions", chat_body("what", max_tokens=16, stream=True))
        assert not paused.task.done()
        paused.resume()
        await paused.task
        return paused, other

    paused, other = runner.run(scenario())
    for body in (paused.body, other.content):
        assert sse_events(body)[-1][1] == "[DONE]"


def test_stream_disconnect_cancels_the_request_and_frees_its_slot(runner, app, served):
    async def scenario():
        cancelled = finished(served, "cancelled")
        body = chat_body(max_tokens=200, temperature=0, stream=True)
        call = AsgiCall(app, "/v1/chat/completions", body, pause_after=2)
        await call.paused.wait()
        call.disconnect()
        await call.task
        await eventually(lambda: finished(served, "cancelled") == cancelled + 1)
        await eventually(lambda: served.admission.in_use == 0)
        assert served.stats().active_requests == 0

    runner.run(scenario())


def test_json_disconnect_cancels_the_request(runner, app, served):
    async def scenario():
        cancelled, admitted = finished(served, "cancelled"), served.stats().requests_admitted
        call = AsgiCall(app, "/v1/chat/completions", chat_body(max_tokens=200, temperature=0))
        await eventually(lambda: served.stats().requests_admitted == admitted + 1)
        call.disconnect()
        await call.task
        await eventually(lambda: finished(served, "cancelled") == cancelled + 1)
        assert served.admission.in_use == 0

    runner.run(scenario())


# -- other endpoints ------------------------------------------------------------------------------


def test_requests_never_consult_opentelemetry(runner, app, monkeypatch):
    """FastAPI's native telemetry is off: no request looks up the global OpenTelemetry providers
    (which reads the environment on every request)."""
    from opentelemetry import _logs, metrics, trace

    def consulted():
        raise AssertionError("a request consulted an OpenTelemetry provider")

    for module, name in ((trace, "get_tracer_provider"), (metrics, "get_meter_provider"),
                         (_logs, "get_logger_provider")):
        monkeypatch.setattr(module, name, consulted)
    assert runner.run(get(app, "/health")).json() == {"status": "ok"}
    assert runner.run(get(app, "/v1/models")).status_code == 200


def test_a_model_s_own_route_counts_as_the_models_endpoint(runner, app, served):
    """``GET /v1/models/{id}`` was counted as ``other``, beside unknown paths."""
    def count(endpoint: str, status: int) -> float:
        return served.metrics.registry.get_sample_value(
            "helios_http_responses_total", {"endpoint": endpoint, "status": str(status)}) or 0.0

    before = {key: count(*key) for key in (("models", 200), ("models", 404), ("other", 404))}
    assert runner.run(get(app, f"/v1/models/{SERVED_ID}")).status_code == 200
    assert runner.run(get(app, "/v1/models/other")).status_code == 404
    assert runner.run(get(app, "/v1/modelsx")).status_code == 404
    assert {key: count(*key) - value for key, value in before.items()} == {
        ("models", 200): 1, ("models", 404): 1, ("other", 404): 1}


def test_models_health_and_metrics(runner, app, served):
    models = runner.run(get(app, "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [SERVED_ID]
    assert models["data"][0]["owned_by"] == served.card.owned_by
    assert runner.run(get(app, f"/v1/models/{SERVED_ID}")).json()["id"] == SERVED_ID
    missing = runner.run(get(app, "/v1/models/other"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert runner.run(get(app, "/health")).json() == {"status": "ok"}
    metrics = runner.run(get(app, "/metrics"))
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ("helios_requests_finished_total", "helios_graph_launches_total", "helios_cache_pages",
                 "flare_mixed_grammar_decode_steps_total", "flare_constrained_max_inflight", "helios_healthy 1.0",
                 "helios_admission_permits_in_use 0.0", f"helios_admission_permits {served.admission.limits.num_permits}.0"):
        assert name in metrics.text

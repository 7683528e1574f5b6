"""Hostile input through the app over a real tiny core and a running model worker: whatever a
client sends is refused at validation with a specific status (400, or 413 for a body over
the size limit), never a 500, the worker keeps serving, and every permit comes back.

Also here: one request's fault on the model worker fails that request only, a reader that stops
taking the body is dropped after the send timeout (and one that pauses and resumes is not), and at
the drain deadline running responses end with one "server shutting down" error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import replace

import httpx
import pytest

from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.frontend.decoding.text_bounds import TextBounds
from helios.server.app import create_app
from helios.server.schemas import MAX_GRAMMAR_CHARS, MAX_MESSAGES, MAX_SCHEMA_NBYTES, MAX_TOOLS, ChatCompletionRequest
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, tiny_core

BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    runtime = build_runtime(opened, RuntimeOptions(queue_capacity=4))
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def served(runtime):
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=2, send_timeout_s=0.5)
    served.start()
    return served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served, max_body_nbytes=BODY_LIMIT)


def chat(content="hello", **fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": content}], **fields}


def send(app, path: str, body, headers=None) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            if path.startswith("GET "):
                return await client.get(path[4:])
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return await client.post(path, content=content, headers=headers or {"content-type": "application/json"})

    return asyncio.run(scenario())


def assert_serving(app, served) -> None:
    """The worker is alive and serves, /health is 200, and no permit is left held."""
    ok = send(app, "/v1/chat/completions", chat(max_tokens=2))
    assert ok.status_code == 200, ok.text
    assert send(app, "GET /health", None).status_code == 200
    assert served.is_healthy and served.admission.in_use == 0


def raw(text: str) -> bytes:
    """A JSON body given as text: escapes like \\ud800 stay escapes (json.dumps would too)."""
    return text.encode("utf-8")


BASE = '{"model": "%s", ' % SERVED_ID
LONE_SURROGATES = {
    "stop": BASE + r'"messages": [{"role": "user", "content": "hi"}], "stop": ["\ud800"]}',
    "stop string": BASE + r'"messages": [{"role": "user", "content": "hi"}], "stop": "a\udfff"}',
    "message content": BASE + r'"messages": [{"role": "user", "content": "x\ud800y"}]}',
    "content part": BASE + r'"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}',
    "tool schema key": BASE + r'"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
    r'"function": {"name": "f", "parameters": {"type": "object", "\ud800": 1}}}]}',
    "template kwarg": BASE + r'"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"k": "\ud800"}}',
    "grammar": BASE + r'"messages": [{"role": "user", "content": "hi"}], "response_format": '
    r'{"type": "grammar", "grammar": "start: \"\ud800\""}}',
    "user": BASE + r'"messages": [{"role": "user", "content": "hi"}], "user": "\ud800"}',
}


@pytest.mark.parametrize("where", list(LONE_SURROGATES))
def test_a_lone_surrogate_anywhere_is_a_400_and_the_worker_keeps_serving(app, served, where):
    response = send(app, "/v1/chat/completions", raw(LONE_SURROGATES[where]))
    assert response.status_code == 400, response.text
    assert "lone surrogate" in response.json()["error"]["message"]
    assert_serving(app, served)


def test_a_lone_surrogate_in_a_completion_prompt_is_a_400(app, served):
    body = BASE + r'"prompt": "once \ud800 upon"}'
    response = send(app, "/v1/completions", raw(body))
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    assert_serving(app, served)


MALFORMED = {
    "utf-8 bom": b"\xef\xbb\xbf" + json.dumps(chat()).encode(),
    "encoded surrogate": json.dumps(chat("@")).encode().replace(b"@", b"\xed\xa0\x80"),
    "invalid utf-8": json.dumps(chat("@")).encode().replace(b"@", b"\xff"),
    "nan": raw(BASE + '"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
    "infinity": raw(BASE + '"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}'),
    "deep nesting": raw(BASE + '"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": '
                        + "[" * 5000 + "]" * 5000 + "}"),
    "nesting past the bound around numbers": raw(BASE + '"messages": [{"role": "user", "content": "hi"}], '
                                                 '"chat_template_kwargs": {"x": ' + "[" * 80 + "1, 2" + "]" * 80 + "}}"),
    "huge integer": raw(BASE + '"messages": [{"role": "user", "content": "hi"}], "seed": ' + "9" * 5000 + "}"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_bodies_that_are_not_strict_utf8_json_are_400(app, served, case):
    response = send(app, "/v1/chat/completions", MALFORMED[case])
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert_serving(app, served)


HI = '"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
OVERFLOWING_NUMBERS = {
    "sampling field": raw(BASE + HI + '"temperature": 1e999}'),
    "template kwarg": raw(BASE + HI + '"chat_template_kwargs": {"x": 1e999}}'),
    "negative, in a list": raw(BASE + HI + '"chat_template_kwargs": {"x": [1, -1E+400]}}'),
    "tool schema": raw(BASE + HI + '"tools": [{"type": "function", "function": {"name": "f", "parameters": '
                       '{"type": "object", "properties": {"a": {"type": "number", "maximum": 1e999}}}}}]}'),
    "response schema": raw(BASE + HI + '"response_format": {"type": "json_schema", "json_schema": {"name": "n", '
                           '"schema": {"type": "number", "minimum": -1e999}}}}'),
}


@pytest.mark.parametrize("case", list(OVERFLOWING_NUMBERS))
def test_a_number_beyond_the_float_range_is_a_400_not_infinity(app, served, case):
    response = send(app, "/v1/chat/completions", OVERFLOWING_NUMBERS[case])
    assert response.status_code == 400, response.text
    assert "number out of range" in response.json()["error"]["message"]
    assert_serving(app, served)


@pytest.mark.parametrize("arguments", ['{"x": NaN}', '{"x": -Infinity}', '{"x": 1e999}'])
def test_tool_call_arguments_are_strict_json_as_the_body_is(app, served, arguments):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    response = send(app, "/v1/chat/completions", chat(messages=messages, max_tokens=2))
    assert response.status_code == 400, response.text
    assert "messages[1].tool_calls[0].function.arguments is not strict JSON" in response.json()["error"]["message"]
    call["function"]["arguments"] = '{"x": 1e300}'
    assert send(app, "/v1/chat/completions", chat(messages=messages, max_tokens=2)).status_code == 200
    assert_serving(app, served)


LOOSE_TYPES = [
    {"temperature": "0.5"}, {"temperature": True}, {"top_p": "1"}, {"max_tokens": "4"}, {"max_tokens": 4.5},
    {"seed": "1"}, {"stream": "true"}, {"stream": 1}, {"stop": 5}, {"n": "1"}, {"frequency_penalty": "0"},
]


@pytest.mark.parametrize("fields", LOOSE_TYPES, ids=lambda f: json.dumps(f))
def test_types_are_strict_as_the_openapi_document_says(app, fields):
    response = send(app, "/v1/chat/completions", chat(**{"max_tokens": 2, **fields}))
    assert response.status_code == 400, response.text


@pytest.mark.parametrize("seed, words", [(2**63, "less than 9223372036854775808"),
                                         (-(2**63) - 1, "greater than or equal to -9223372036854775808")])
def test_an_integer_bound_is_named_exactly(app, seed, words):
    """pydantic printed 2**63 as a float: "less than 9223372036854776000", a seed the server takes."""
    error = send(app, "/v1/chat/completions", chat(max_tokens=2, seed=seed)).json()["error"]
    assert error["message"] == f"invalid request body: seed: Input should be {words}" and error["param"] == "seed"


def test_an_integer_is_a_number(app):
    assert send(app, "/v1/chat/completions", chat(max_tokens=2, temperature=1, top_p=1)).status_code == 200


def test_a_number_with_no_fraction_is_an_integer_as_the_openapi_document_says(app):
    # JSON Schema's "integer" (the document's type for these fields) includes 2.0
    response = send(app, "/v1/chat/completions", chat(max_tokens=2.0, n=1.0, seed=7.0))
    assert response.status_code == 200, response.text


def test_bodies_over_the_limit_are_413_before_they_are_read(app, served):
    big = json.dumps(chat("x" * BODY_LIMIT)).encode()
    response = send(app, "/v1/chat/completions", big)
    assert response.status_code == 413 and "at most" in response.json()["error"]["message"]

    async def chunked():  # no Content-Length: counted while reading
        async def parts():
            for start in range(0, len(big), 4096):
                yield big[start:start + 4096]

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/chat/completions", content=parts(), headers={"content-type": "application/json"})

    assert asyncio.run(chunked()).status_code == 413
    assert_serving(app, served)


def tool(index: int, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": f"f{index}", "parameters": parameters or {"type": "object"}}}


OVER_LIMITS = {
    "messages": chat(messages=[{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)),
    "tools": chat(tools=[tool(i) for i in range(MAX_TOOLS + 1)]),
    "schema size": chat(tools=[tool(0, {"type": "object", "description": "d" * MAX_SCHEMA_NBYTES})]),
    "schema depth": chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": json.loads(
        '{"items": ' * 40 + "{}" + "}" * 40)}}),
    "grammar size": chat(response_format={"type": "grammar", "grammar": "start: " + '"a" ' * MAX_GRAMMAR_CHARS}),
    "regex size": chat(response_format={"type": "regex", "regex": "a" * 5000}),
}


@pytest.mark.parametrize("case", list(OVER_LIMITS))
def test_list_and_schema_sizes_are_bounded(served, case):
    app = create_app(served, max_body_nbytes=1 << 20)
    response = send(app, "/v1/chat/completions", OVER_LIMITS[case])
    assert response.status_code == 400, response.text
    assert_serving(app, served)


def test_text_beyond_the_context_extent_is_refused_before_tokenizing(served):
    app = create_app(served, max_body_nbytes=1 << 20)
    bound = TextBounds.from_tokenizer(served.frontend._tokenizer, served.card.context_tokens).max_text_chars
    for path, body in (("/v1/chat/completions", chat("ab" * (bound // 2 + 1))),
                       ("/v1/completions", {"model": SERVED_ID, "prompt": "z" * (bound + 1)})):
        response = send(app, path, body)
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
        assert "longer than any prompt" in response.json()["error"]["message"]
    assert_serving(app, served)


def test_a_deep_grammar_within_the_size_bound_compiles_in_a_preparation_thread(served):
    """A rule chain this deep overflows a default 8 MiB thread stack inside llguidance (a segfault
    of the whole server); preparation threads have room for the deepest grammar the bound allows."""
    app = create_app(served, max_body_nbytes=1 << 20)
    depth = MAX_GRAMMAR_CHARS // 19  # about 3,400; 2,800 already overflow 8 MiB
    grammar = "start: a0\n" + "\n".join(f'a{i}:"x"a{i + 1}|"y"' for i in range(depth)) + f'\na{depth}:"z"\n'
    assert len(grammar) <= MAX_GRAMMAR_CHARS
    response = send(app, "/v1/chat/completions", chat(max_tokens=2, response_format={"type": "grammar", "grammar": grammar}))
    assert response.status_code in (200, 400), response.text
    assert_serving(app, served)


# -- one request's fault on the model worker --------------------------------------------------------


def submit_direct(served, spec: dict, **hooks) -> list:
    """Submits an engine request straight to the worker (bypassing validation); its events."""
    events, finished = [], threading.Event()

    def on_event(event):
        events.append(event)
        if isinstance(event, FinishEvent):
            finished.set()

    prepared = served.frontend.prepare_chat(ChatCompletionRequest(**chat(max_tokens=4)))
    request = EngineRequest(replace(prepared.request_spec(), **spec), on_event, **hooks)
    served.engine.submit(request)
    assert finished.wait(30), "the request never ended"
    return events


def test_a_request_that_reaches_the_worker_unvalidated_fails_alone(app, served):
    events = submit_direct(served, {"stop_strings": ("\ud800",)})
    assert events[-1].reason in (FinishReason.REJECTED, FinishReason.ERROR)
    assert_serving(app, served)


class BrokenGrammar:
    def fill_bitmask(self, row) -> None:
        row.fill(-1)

    def consume_token(self, token_id: int) -> object:
        raise RuntimeError("grammar state corrupted")


def test_a_request_whose_hooks_raise_fails_alone(app, served):
    events = submit_direct(served, {}, grammar=BrokenGrammar())
    assert events[-1].reason is FinishReason.ERROR and "grammar state corrupted" in events[-1].message

    def broken_stop(token_id: int) -> bool:
        raise ValueError("stop matcher failed")

    events = submit_direct(served, {"stop_strings": ("zz",)}, host_stop=broken_stop)
    assert events[-1].reason is FinishReason.ERROR and "stop matcher failed" in events[-1].message
    assert served.engine.scheduler.counters().num_running == 0
    assert_serving(app, served)


# -- slow readers and shutdown ---------------------------------------------------------------------


class Reader:
    """One POST through the ASGI app whose reader takes `take` body chunks, then stalls for
    `stall_s` (None: for good) before taking the rest."""

    def __init__(self, app, body: dict, take: int, stall_s: float | None):
        self.status, self.chunks = None, []
        self._body, self._take, self._stall_s = json.dumps(body).encode(), take, stall_s
        self._is_sent = False
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
                 "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 80)}
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode()

    async def _receive(self):
        if not self._is_sent:
            self._is_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await asyncio.Event().wait()  # connected for good

    async def _send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        self.chunks.append(message.get("body", b""))
        if len(self.chunks) == self._take:
            await asyncio.sleep(self._stall_s if self._stall_s is not None else 3600)


def test_a_reader_that_stops_is_dropped_after_the_send_timeout_and_one_that_pauses_is_not(app, served):
    body = chat(max_tokens=24, temperature=0, stream=True)

    async def scenario():
        gone = Reader(app, body, take=2, stall_s=None)
        paused = Reader(app, body, take=2, stall_s=0.2)  # under the 0.5 s send timeout
        await asyncio.wait_for(asyncio.gather(gone.task, paused.task), 20)
        for _ in range(200):
            if served.admission.in_use == 0:
                break
            await asyncio.sleep(0.01)
        return gone, paused

    gone, paused = asyncio.run(scenario())
    assert paused.text.rstrip().endswith("data: [DONE]")
    assert "[DONE]" not in gone.text and len(gone.chunks) == 2
    assert_serving(app, served)


def test_a_reader_that_stops_taking_a_json_body_of_several_choices_is_dropped_after_the_send_timeout(app, served):
    """A body of ``n`` choices was written with no send deadline (and their permits given back first):
    a client that stopped reading held its response for good."""
    async def scenario():
        gone = Reader(app, chat(max_tokens=4, temperature=0, n=2), take=1, stall_s=None)
        await asyncio.wait_for(gone.task, 20)
        assert gone.status == 200

    asyncio.run(scenario())
    assert_serving(app, served)


def test_at_the_drain_deadline_running_responses_end_with_one_shutting_down_error(app, served, monkeypatch):
    launch = served.engine.executor.launch

    def slow_launch(*args, **kwargs):  # a slow model, so that responses are still running
        time.sleep(0.02)
        return launch(*args, **kwargs)

    monkeypatch.setattr(served.engine.executor, "launch", slow_launch)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
            admitted = served.stats().requests_admitted  # the module's earlier tests' requests count too
            streams = [asyncio.ensure_future(client.post("/v1/chat/completions", json=chat(
                max_tokens=200, temperature=0, stream=True))) for _ in range(2)]
            # Greedy, as the streams: a sampled reply may end at its end-of-sequence token before the
            # deadline (some of the tiny model's sampled replies end within a few tokens).
            plain = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat(max_tokens=200,
                                                                                          temperature=0)))
            while served.stats().requests_admitted < admitted + 3:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            count = served.interrupt_responses()
            results = await asyncio.gather(*streams, plain)
            for _ in range(500):  # permits come back once the engine confirmed the cancellations
                if served.admission.in_use == 0:
                    break
                await asyncio.sleep(0.01)
            return count, results

    try:
        count, (*streams, plain) = asyncio.run(scenario())
    finally:
        served._is_dropping = False
    assert count == 3
    for stream in streams:
        assert stream.text.count("event: error") == 1 and "server shutting down" in stream.text
        assert "[DONE]" not in stream.text
    assert plain.status_code == 503 and plain.json()["error"]["type"] == "server_shutting_down"
    monkeypatch.undo()
    assert_serving(app, served)


# -- clients that leave, over real sockets ---------------------------------------------------------


@pytest.fixture(scope="module")
def live(served):
    """The app served by uvicorn as `helios serve` runs it (uvloop, httptools, the transport send in
    the scope) on a free port of this host, in a thread; its port."""
    import socket

    import uvicorn

    from helios.server.responses import with_transport_send

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(with_transport_send(create_app(served, max_body_nbytes=BODY_LIMIT)), loop="uvloop",
                            http="httptools", lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def http_post(body: bytes, declared_len: int | None = None) -> bytes:
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if declared_len is None else declared_len}\r\n\r\n")
    return head.encode() + body


def exchange(port: int, data: bytes, half_close: bool = True) -> bytes:
    """Sends `data` on a fresh connection, closes the sending side (or the socket), reads to the end."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        if not half_close:
            return b""
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def access_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "helios.access"]


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [False, True])
def test_pipelined_requests_then_a_half_close_end_quietly_as_a_disconnect(live, app, served, caplog, stream):
    """uvicorn closes the transport when the client half-closes a pipelined connection without
    marking the running request disconnected: its response's write finds the transport closed. That
    is a client that left (one DEBUG line, the access log's 499), not an application error with an
    80-line traceback; the request's permit comes back."""
    caplog.set_level(logging.DEBUG)
    first = json.dumps(chat(max_tokens=4, stream=stream)).encode()
    exchange(live, http_post(first) + http_post(json.dumps(chat(max_tokens=4)).encode()))
    wait_for(lambda: access_lines(caplog) and served.admission.in_use == 0)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert any("its client is gone" in r.getMessage() for r in caplog.records)
    # A JSON response starts once the request ended: its client was gone by then. A stream starts
    # at once, which may be before uvicorn read the half-close; it then logs its 200.
    status = access_lines(caplog)[0].split('" ')[1].split()[0]
    assert status in (("499", "200") if stream else ("499",))
    assert_serving(app, served)


def server_errors(served) -> float:
    return served.metrics.registry.get_sample_value("helios_http_responses_total",
                                                    {"endpoint": "chat", "status": "500"}) or 0.0


def test_a_client_that_leaves_before_its_body_is_complete_is_499_not_500(live, served, caplog):
    caplog.set_level(logging.INFO, logger="helios.access")
    failures = server_errors(served)
    body = json.dumps(chat(max_tokens=4)).encode()
    exchange(live, http_post(body, declared_len=len(body) + 50), half_close=False)  # closes, 50 bytes short
    wait_for(lambda: access_lines(caplog))
    (line,) = access_lines(caplog)
    assert '"POST /v1/chat/completions" 499' in line
    assert server_errors(served) == failures  # and no response is counted as a server error

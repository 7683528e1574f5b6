"""`SSEResponse`: the start and the last message go through the application's middlewares, the
per-step writes in between to the server's own send (`TRANSPORT_SEND`) when the scope has it, and
the client accumulates the same stream either way (equal to the JSON response of the same greedy
request); the last chunk and the end of the body are one message; a client that disconnects ends
the response quietly, cancels its request and releases its permit."""

from __future__ import annotations

import asyncio
import json

import pytest

from helios.frontend.responses.presentation import StreamPresenter
from helios.server.app import create_app
from helios.server.responses import TRANSPORT_SEND, ClientGoneGuard, Handoff
from support.server_core import SERVED_ID, served_tiny_core
from test_slow_reader import accumulated, eventually, post  # tests/server is on sys.path (no package)

WAIT_S = 60.0
MAX_TOKENS = 8
STEP_TOKENS = 64
PAYLOAD = {"model": SERVED_ID, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True,
           "prompt": [5, 9, 14, 3, 22], "logprobs": 1}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


def scope_of(body: bytes) -> dict:
    path = "/v1/completions"
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 5000), "server": ("test", 80), "state": {}}


async def stream(app, *, with_transport: bool, disconnect_after: int | None = None, pause=None, payload=PAYLOAD):
    """Streams PAYLOAD through `app`: every message in order, each tagged with the send it went
    to ("chain": the middlewares' send, "transport": the scope's `TRANSPORT_SEND`, "direct": that
    send called outside any task, from the loop's delivery). `pause(n)`: awaited by the transport
    send before its n-th message is recorded (a write that must wait). After `disconnect_after`
    body messages the client is gone: `receive` says so and every later write waits forever, so
    the response can end only by noticing the disconnect, however fast the steps arrive."""
    body = json.dumps({**payload, "stream": True}).encode()
    scope = scope_of(body)
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
            is_direct = tag == "transport" and asyncio.current_task() is None
            if tag == "transport" and pause is not None:
                await pause(sum(t != "chain" for t, _ in messages))
            messages.append(("direct" if is_direct else tag, message))
            bodies = [m for _, m in messages if m["type"] == "http.response.body"]
            if disconnect_after is not None and len(bodies) == disconnect_after:
                gone.set()
        return send

    if with_transport:
        scope[TRANSPORT_SEND] = recording("transport")
    await asyncio.wait_for(app(scope, receive, recording("chain")), WAIT_S)
    return messages


def chunks_of(messages) -> list[dict]:
    text = b"".join(m.get("body", b"") for _, m in messages if m["type"] == "http.response.body").decode()
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


@pytest.mark.parametrize("with_transport", [True, False])
def test_steps_go_below_the_middlewares_and_the_stream_is_unchanged(runner, app, with_transport):
    # Enough steps that some are written before the last: a tiny core's 8 tokens could all be done
    # before the first write, leaving nothing between the start and the last message on a busy machine.
    payload = {**PAYLOAD, "max_tokens": STEP_TOKENS}
    reference = runner.run(post(app, "/v1/completions", payload))["choices"][0]
    messages = runner.run(stream(app, with_transport=with_transport, payload=payload))
    start, *steps, last = messages
    assert start[0] == "chain" and start[1]["type"] == "http.response.start" and start[1]["status"] == 200
    assert sorted(start[1]["headers"]) == [(b"cache-control", b"no-cache"), (b"content-type", b"text/event-stream; charset=utf-8"),
                                           (b"x-accel-buffering", b"no")]  # no length: the body is chunked
    assert last[0] == "chain" and last[1]["more_body"] is False and last[1]["body"].endswith(b"data: [DONE]\n\n")
    assert steps and all(tag in (("transport", "direct") if with_transport else ("chain",)) and m["more_body"]
                         for tag, m in steps)
    state = accumulated(chunks_of(messages), is_chat=False)
    assert state["text"] == reference["text"] and state["finish"] == ["length"]
    assert state["token_ids"] == reference["token_ids"] and len(state["token_ids"]) == STEP_TOKENS
    assert state["logprobs"] == {k: v for k, v in reference["logprobs"].items() if v is not None}


def test_a_client_that_disconnects_ends_the_response_and_frees_its_request(runner, app, served):
    long = {**PAYLOAD, "max_tokens": 200}  # far more steps than can come before the first write
    messages = runner.run(stream(app, with_transport=True, disconnect_after=1, payload=long))
    assert not any(m.get("more_body") is False for _, m in messages)  # no end: the client is gone
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert served.engine.scheduler.counters().num_running == 0


async def _bare_yield(n: int) -> None:
    if n % 2:
        await asyncio.sleep(0)


async def _flow_paused(n: int) -> None:
    if n % 3 == 1:  # the connection is paused until a later loop turn resumes it
        resumed = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, resumed.set)
        await resumed.wait()


@pytest.mark.parametrize("pause", [None, _bare_yield, _flow_paused])
def test_steps_written_from_the_delivery_keep_the_stream_exact(runner, app, pause, monkeypatch):
    """Steps that arrive while the response waits are written in the loop's delivery ("direct");
    a write that must wait is finished by the response's task before anything later."""
    finished = []
    finish = Handoff.finish

    async def counted(handoff):
        finished.append(handoff.write is not None)
        await finish(handoff)

    monkeypatch.setattr(Handoff, "finish", counted)
    reference = runner.run(post(app, "/v1/completions", PAYLOAD))["choices"][0]
    direct = 0
    for _ in range(3):  # the first step can arrive before the response waits
        messages = runner.run(stream(app, with_transport=True, pause=pause))
        direct += sum(tag == "direct" for tag, _ in messages)
        state = accumulated(chunks_of(messages), is_chat=False)
        assert state["text"] == reference["text"] and state["finish"] == ["length"]
        assert state["token_ids"] == reference["token_ids"]
        assert state["logprobs"] == {k: v for k, v in reference["logprobs"].items() if v is not None}
        assert messages[-1][0] == "chain" and messages[-1][1]["more_body"] is False
    assert direct > 0
    assert (pause is None) == (not finished) and all(finished)  # waiting writes were handed to the task


def test_a_direct_write_that_waits_ends_at_the_send_timeout(runner, served):
    """A write from the delivery that never completes is finished by the response's task, so the
    send deadline still drops the response and frees its request."""
    async def stalled(n: int) -> None:
        if n >= 2:  # the client stops reading: this write never completes
            await asyncio.Event().wait()

    timeout_s, served.send_timeout_s = served.send_timeout_s, 0.3
    try:
        messages = runner.run(stream(create_app(served), with_transport=True, pause=stalled))
    finally:
        served.send_timeout_s = timeout_s
    assert not any(m.get("more_body") is False for _, m in messages)  # dropped, never ended
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert served.engine.scheduler.counters().num_running == 0


def test_a_stream_interval_writes_steps_n_at_a_time_with_the_same_content(runner, app, served):
    """With a stream interval of 3 the first step is written at once, later steps three at a time
    (as one run), and the last ones with the end: fewer writes, the same stream."""
    reference = runner.run(post(app, "/v1/completions", PAYLOAD))["choices"][0]
    interval, served.stream_interval = served.stream_interval, 3
    try:
        messages = runner.run(stream(app, with_transport=True))
    finally:
        served.stream_interval = interval
    state = accumulated(chunks_of(messages), is_chat=False)
    assert state["text"] == reference["text"] and state["token_ids"] == reference["token_ids"]
    assert state["logprobs"] == {k: v for k, v in reference["logprobs"].items() if v is not None}
    bodies = [m for _, m in messages if m["type"] == "http.response.body"]
    ids_per_write = [sum(len(c["choices"][0].get("token_ids", [])) for c in chunks_of([("", m)])) for m in bodies]
    assert ids_per_write == [1, 3, 3, 1]  # MAX_TOKENS 8: the first, two runs of three, the last with the end
    assert bodies[-1]["more_body"] is False


PLAIN = {k: v for k, v in PAYLOAD.items() if k != "logprobs"}  # steps rendered by `sse_plain_step`


@pytest.mark.parametrize("pause", [None, _flow_paused])
def test_plain_steps_keep_the_stream_exact_one_write_per_step(runner, app, pause, monkeypatch):
    """Steps without log-probabilities (one format per step from the stream's template) give the
    stream of the JSON response, at most one step or run a write, direct or after a paused write."""
    rendered = []
    plain_step = StreamPresenter.sse_plain_step

    def counted(presenter, step):
        chunk = plain_step(presenter, step)
        rendered.append(chunk is not None)
        return chunk

    monkeypatch.setattr(StreamPresenter, "sse_plain_step", counted)
    reference = runner.run(post(app, "/v1/completions", PLAIN))["choices"][0]
    messages = runner.run(stream(app, with_transport=True, pause=pause, payload=PLAIN))
    state = accumulated(chunks_of(messages), is_chat=False)
    assert state["text"] == reference["text"] and state["finish"] == ["length"]
    assert state["token_ids"] == reference["token_ids"] and len(state["token_ids"]) == MAX_TOKENS
    steps = [m for tag, m in messages if tag != "chain"]
    assert all(len(chunks_of([("", m)])) <= 2 for m in steps)  # one step (its ids chunk and text chunk) a write
    assert messages[-1][0] == "chain" and messages[-1][1]["body"].endswith(b"data: [DONE]\n\n")
    if pause is None:  # steps that piled up behind a paused write are merged into runs instead
        assert sum(rendered) >= MAX_TOKENS - 2  # every step after the first took the plain path


def test_a_disconnect_between_plain_steps_frees_the_request(runner, app, served):
    messages = runner.run(stream(app, with_transport=True, disconnect_after=3, payload=PLAIN))
    assert not any(m.get("more_body") is False for _, m in messages)
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert served.engine.scheduler.counters().num_running == 0


def test_a_stalled_reader_does_not_stall_other_streams(runner, served):
    """One client stops reading (its write never completes) while another streams: the other
    stream ends complete while the stalled one waits, and the stalled one is dropped at the send
    timeout with its request freed."""
    async def stalled(n: int) -> None:
        if n >= 2:
            await asyncio.Event().wait()

    async def both():
        app = create_app(served)
        ended = {}

        async def timed(name, **options):
            messages = await stream(app, with_transport=True, payload=PLAIN, **options)
            ended[name] = asyncio.get_running_loop().time()
            return messages

        stuck, moving = await asyncio.gather(timed("stuck", pause=stalled), timed("moving"))
        return stuck, moving, ended

    timeout_s, served.send_timeout_s = served.send_timeout_s, 2.0
    try:
        stuck, moving, ended = runner.run(both())
    finally:
        served.send_timeout_s = timeout_s
    assert moving[-1][1]["more_body"] is False
    assert len(accumulated(chunks_of(moving), is_chat=False)["token_ids"]) == MAX_TOKENS
    assert not any(m.get("more_body") is False for _, m in stuck)  # dropped, never ended
    assert ended["moving"] < ended["stuck"]
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert served.engine.scheduler.counters().num_running == 0


CLOSED = "unable to perform operation on <TCPTransport closed=True reading=False 0x1>; the handler is closed"


class ClosingCycle:
    """A server's response cycle whose transport closes after `writes_left` writes without the
    cycle being told (uvicorn's pipelined-request race): later writes raise `error`."""

    def __init__(self, writes_left: int, error: BaseException):
        self.transport = self
        self.disconnected = False
        self._writes_left, self._error = writes_left, error

    def is_closing(self) -> bool:
        return self._writes_left <= 0

    async def send(self, _message) -> None:
        if self._writes_left <= 0:
            raise self._error
        self._writes_left -= 1


async def closing_stream(app, cycle: ClosingCycle, payload=PAYLOAD):
    body = json.dumps({**payload, "stream": True}).encode()
    scope = scope_of(body)
    scope[TRANSPORT_SEND] = cycle.send
    is_sent = False

    async def receive():
        nonlocal is_sent
        if not is_sent:
            is_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the server never notices the client left (the race)

    await asyncio.wait_for(app(scope, receive, cycle.send), WAIT_S)


@pytest.mark.parametrize("writes_left", [0, 2])  # the start, or a step after it, finds the transport closed
@pytest.mark.parametrize("error", [RuntimeError(CLOSED), BrokenPipeError(32, "Broken pipe")])
def test_a_write_to_a_closed_transport_ends_the_stream_as_a_disconnect(runner, app, served, caplog, writes_left, error):
    caplog.set_level("DEBUG", logger="uvicorn.error")
    cycle = ClosingCycle(writes_left, error)
    runner.run(closing_stream(app, cycle, payload={**PAYLOAD, "max_tokens": 200}))  # no error raised
    assert cycle.disconnected  # marked as uvicorn marks a lost connection's request: it ends quietly
    runner.run(eventually(lambda: served.admission.in_use == 0))
    assert not [r for r in caplog.records if r.levelno >= 30]
    assert any("its client is gone" in r.getMessage() for r in caplog.records if r.levelname == "DEBUG")


def test_other_runtime_errors_of_a_write_are_not_a_disconnect(runner, app, served):
    cycle = ClosingCycle(0, RuntimeError("a bug in a write"))
    cycle.is_closing = lambda: False  # the transport is open: the error is the server's own
    with pytest.raises(RuntimeError, match="a bug in a write"):
        runner.run(closing_stream(app, cycle))
    assert not cycle.disconnected
    runner.run(eventually(lambda: served.admission.in_use == 0))


def guarded_run(fails_at_write: bool, error: BaseException) -> ClosingCycle:
    """`ClientGoneGuard` around an application that fails with `error` at its first write
    (`fails_at_write`) or by itself, on a connection whose transport has closed."""
    cycle = ClosingCycle(0, error)
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", TRANSPORT_SEND: cycle.send}

    async def application(_scope, _receive, send):
        if not fails_at_write:
            raise error  # e.g. the pipe to the engine process broke: a fault of the server's own
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.disconnect"}

    asyncio.run(ClientGoneGuard(application)(scope, receive, cycle.send))
    return cycle


@pytest.mark.parametrize("error", [RuntimeError(CLOSED), BrokenPipeError(32, "Broken pipe")])
def test_only_a_failed_write_is_a_client_gone_not_the_same_error_raised_elsewhere(error):
    assert guarded_run(True, error).disconnected  # quiet: the write found the client gone
    with pytest.raises(type(error)):
        guarded_run(False, error)  # the transport is closing too, but no write failed: the error is the server's

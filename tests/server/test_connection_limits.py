"""What a connection may hold before its request is admitted (`helios.server.connection_limits`),
over real sockets against uvicorn run with `helios serve`'s own settings (`serve.uvicorn_config`)
in a thread, in front of `BodyGuard` and a tiny application (the limits sit below any route):

- a request line plus header block over the cap gets 431 and the parser is never fed more than
  the cap, however much the client sends; a head within the cap whose body comes in the same read
  is served;
- a partial request line or header block gets 408 at the (shortened) head deadline, also on a
  kept-alive connection's second request; a connection that sends nothing is closed at it;
- a partial body gets BodyGuard's 408 JSON error at the body deadline; a body no route reads,
  trickling in, closes the connection at it;
- connections beyond the cap get 503 and are closed, one log line tells, and the server answers
  once a connection is free; a refused client that sent its request first still reads the 503 (not a
  reset), and refused connections linger at most `REFUSAL_LINGER_S`;
- on a kept-alive connection, a bare CRLF (which cancels uvicorn's keep-alive timer and begins no
  message) still meets the head deadline;
- pipelined requests in one read larger than the cap are each judged on their own head;
- a deadline that passes while an earlier response is still streaming writes nothing into it: the
  stream ends whole and the connection closes;
- a pipelined request's body deadline counts from when its task starts, not from its headers.
- bytes the parser refuses get a JSON 400; a malformed request pipelined behind another is never
  answered into (or instead of) the response before it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import threading
import time
from dataclasses import replace
from unittest import mock

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from helios.server import connection_limits
from helios.server.body_guard import BodyGuard
from helios.server.connection_limits import ConnectionLimits, GuardedHttpToolsProtocol, RefusalLog, fit_to_fd_limit
from helios.server.serve import ServeOptions, bind, uvicorn_config

HEAD_CAP = 8 * 1024
SHORT = ConnectionLimits(max_head_nbytes=HEAD_CAP, head_timeout_s=0.5, body_timeout_s=0.5, max_connections=64)
WAIT_S = 10.0  # generous: far beyond every shortened deadline
STREAM_STEP_S = 0.25


class CountingProtocol(HttpToolsProtocol):
    """Counts the bytes the guard feeds to uvicorn's parser (what uvicorn and httptools may buffer)."""

    fed_nbytes: list[int] = []

    def data_received(self, data: bytes) -> None:
        self.fed_nbytes.append(len(data))
        super().data_received(data)


class Recording(GuardedHttpToolsProtocol, CountingProtocol):
    pass


async def tiny_app(scope, receive, send) -> None:
    """GET: 200 "ok"; POST (behind BodyGuard, so its body is whole): 200 with the body's length;
    /stream?N: a chunked response of N chunks, STREAM_STEP_S apart."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/stream":  # chunked: `?N` chunks, one every STREAM_STEP_S
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(int(scope["query_string"])):
            await asyncio.sleep(STREAM_STEP_S)
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"ok"
    if scope["method"] == "POST":
        body = str(len((await receive())["body"])).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


class Server:
    """uvicorn with `serve`'s settings and `limits`, on a free port, in a thread of this process."""

    def __init__(self, limits: ConnectionLimits):
        with mock.patch.object(uvicorn.Config, "configure_logging"):  # leave this process's logging alone
            config = uvicorn_config(BodyGuard(tiny_app), ServeOptions(log_level="warning"), limits)
        config.http = functools.partial(Recording, limits=limits, refusals=RefusalLog(limits.max_connections))
        self.server = uvicorn.Server(config)
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
        return sock

    def get_health(self) -> bytes:
        with self.connect() as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return read_all(sock)


@pytest.fixture(scope="module")
def server():
    with Server(SHORT) as running:
        yield running


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (a reset after a response counts as the close)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def send_until_refused(sock: socket.socket, first: bytes, chunk: bytes, total_nbytes: int) -> None:
    sock.sendall(first)
    sent = 0
    try:
        while sent < total_nbytes:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed: what it answered is in the receive buffer


def error_of(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


HEADER_LINES = b"".join(b"X-P%d: %s\r\n" % (i, b"a" * 1000) for i in range(64))
OVERSIZED_HEADS = {
    "many header lines": (b"GET /health HTTP/1.1\r\nHost: x\r\n", HEADER_LINES),
    "one huge header value": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * 65536),
    "a huge request target": (b"GET /v1/models/", b"a" * 65536),
}


@pytest.mark.parametrize("case", list(OVERSIZED_HEADS))
def test_an_oversized_head_gets_431_and_is_never_fed_past_the_cap(server, case):
    CountingProtocol.fed_nbytes = []
    first, chunk = OVERSIZED_HEADS[case]
    with server.connect() as sock:
        send_until_refused(sock, first, chunk, 8 << 20)
        status, error = error_of(read_all(sock))
    assert status == 431 and f"{HEAD_CAP} bytes" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == 431
    assert sum(CountingProtocol.fed_nbytes) <= HEAD_CAP  # 8 MiB sent: uvicorn never saw more than the cap
    assert b"200 OK" in server.get_health()


def test_a_head_within_the_cap_whose_body_is_in_the_same_read_is_served(server):
    body = json.dumps({"x": "y" * 200_000}).encode()
    pad = b"X-Pad: " + b"a" * (HEAD_CAP - 200) + b"\r\n"
    request = (b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               + pad + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    with server.connect() as sock:
        sock.sendall(request)
        response = read_all(sock)
    assert response.startswith(b"HTTP/1.1 200") and response.endswith(b"%d" % len(body))


PARTIAL_HEADS = {
    "a partial request line": b"POST /v1/chat/comp",
    "partial headers": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
    "a kept-alive connection's partial second request": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /hea",
}


@pytest.mark.parametrize("case", list(PARTIAL_HEADS))
def test_a_partial_head_gets_408_at_the_head_deadline(server, case):
    with server.connect() as sock:
        sock.sendall(PARTIAL_HEADS[case])
        response = read_all(sock)
    status, error = error_of(response[response.rfind(b"HTTP/1.1 "):])
    assert status == 408 and "did not arrive within 0.5 s" in error["message"]


def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline(server):
    with server.connect() as sock:
        assert read_all(sock) == b""


def test_a_partial_body_gets_408_at_the_body_deadline(server):
    body = json.dumps({"model": "m", "messages": []}).encode()
    with server.connect() as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        response = read_all(sock)
    status, error = error_of(response)
    assert status == 408 and error["message"] == "the request body did not arrive within 0.5 s"
    assert b"connection: close" in response.lower()


def test_a_body_no_route_reads_trickling_past_its_deadline_closes_the_connection(server, monkeypatch):
    monkeypatch.setattr(connection_limits, "BODY_GRACE_S", 0.1)
    with server.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        sock.settimeout(0.1)
        response, is_closed = b"", False
        for _ in range(40):  # a byte every 0.1 s (each would push uvicorn's keep-alive timer away)
            try:
                sock.sendall(b"x")
                while chunk := sock.recv(65536):
                    response += chunk
                is_closed = True
                break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                is_closed = True
                break
    assert response.startswith(b"HTTP/1.1 200") and is_closed


def test_connections_beyond_the_cap_get_503_one_log_line_tells_and_the_server_serves_after():
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        with Server(replace(SHORT, head_timeout_s=WAIT_S, max_connections=4)) as server:
            held = [server.connect() for _ in range(4)]
            time.sleep(0.2)  # let the server accept them
            refused = []
            for _ in range(3):
                with server.connect() as sock:
                    refused.append(error_of(read_all(sock)))
            assert [status for status, _ in refused] == [503] * 3
            assert refused[0][1]["type"] == "overloaded" and "4 open connections" in refused[0][1]["message"]
            held.pop().close()
            time.sleep(0.2)  # let the server see the close
            assert b"200 OK" in server.get_health()
            for sock in held:
                sock.close()
    finally:
        logger.removeHandler(handler)
    refusals = [line for line in lines if "refused" in line]
    assert refusals == ["refused 1 connection(s): 4 are open, the limit (--max-connections)"]  # the rest after 10 s


def test_the_cap_is_fitted_to_the_open_file_limit(monkeypatch):
    limits = ConnectionLimits(max_connections=4096)
    monkeypatch.setattr(connection_limits.resource, "getrlimit", lambda which: (1024, 2048))
    monkeypatch.setattr(connection_limits.resource, "setrlimit", lambda which, pair: calls.append(pair))
    calls: list = []
    assert fit_to_fd_limit(limits).max_connections == 2048 - connection_limits.FD_RESERVE
    assert calls == [(2048, 2048)]  # raised as far as the hard limit allows
    monkeypatch.setattr(connection_limits.resource, "getrlimit", lambda which: (1024, 1 << 20))
    calls.clear()
    assert fit_to_fd_limit(limits) == limits and calls == [(4096 + connection_limits.FD_RESERVE, 1 << 20)]


def read_response(sock: socket.socket, end: bytes) -> bytes:
    """Reads until what was read ends with `end` (the connection stays open)."""
    response = b""
    while not response.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, response
        response += chunk
    return response


def test_a_bare_crlf_after_a_kept_alive_response_meets_the_head_deadline(server):
    with server.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, b"\r\n\r\nok").startswith(b"HTTP/1.1 200")
        sock.sendall(b"\r\n")  # cancels uvicorn's keep-alive timer; the parser skips it, no message begins
        # uvicorn's own keep-alive timeout is 5 s: a close within 3 s (the socket's timeout raises
        # otherwise) comes from the head deadline
        sock.settimeout(3.0)
        assert read_all(sock) == b""  # closed quietly, no request having begun


def test_pipelined_requests_in_one_read_larger_than_the_cap_are_each_judged_on_their_own_head(server):
    def post(body: bytes, extra: bytes = b"") -> bytes:
        return (b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
                + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    body = json.dumps({"x": "y" * (HEAD_CAP - 300)}).encode()
    pad = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    request = post(body) + post(body, b"Connection: close\r\n" + pad)  # > the cap; the second head ends past it
    assert len(post(body)) < HEAD_CAP < len(request)
    with server.connect() as sock:
        sock.sendall(request)
        response = read_all(sock)
    assert response.count(b"HTTP/1.1 200") == 2 and response.endswith(b"%d" % len(body)), response[:300]


def test_a_head_deadline_during_an_earlier_streaming_response_writes_nothing_into_it(server):
    with server.connect() as sock:
        sock.sendall(b"GET /stream?6 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.1)
        sock.sendall(b"GET /hea")  # a pipelined partial head: its 0.5 s deadline passes mid-stream
        response = read_all(sock)
    assert b"408" not in response and response.startswith(b"HTTP/1.1 200")
    assert response.endswith(b"data: 5\n\n\r\n0\r\n\r\n")  # the stream ended whole, then the connection closed


def test_a_pipelined_body_deadline_counts_from_when_its_request_starts(monkeypatch):
    monkeypatch.setattr(connection_limits, "BODY_GRACE_S", 0.1)
    # Backstop 2.1 s. The stream ends at about 2.0 s: counted from the pipelined request's headers
    # (t=0), the backstop would pass at 2.1 s, before the rest of the body (2.7 s) and long before
    # BodyGuard's own deadline (2.0 s after the request's task starts, at about 4.0 s).
    body = json.dumps({"x": "y" * 100}).encode()
    with Server(replace(SHORT, head_timeout_s=WAIT_S, body_timeout_s=2.0)) as running, running.connect() as sock:
        sock.sendall(b"GET /stream?8 HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        first = read_response(sock, b"0\r\n\r\n")
        time.sleep(0.7)
        sock.sendall(body[10:])
        response = read_all(sock)
    assert first.startswith(b"HTTP/1.1 200")
    assert response.startswith(b"HTTP/1.1 200") and response.endswith(b"%d" % len(body)), response


def test_a_refused_client_that_sent_its_request_reads_the_503_and_refusals_do_not_linger(monkeypatch):
    monkeypatch.setattr(connection_limits, "REFUSAL_LINGER_S", 0.3)
    request = b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    with Server(replace(SHORT, head_timeout_s=WAIT_S, max_connections=2)) as running:
        refusals = running.server.config.http.keywords["refusals"]
        held = [running.connect() for _ in range(2)]
        time.sleep(0.2)  # let the server accept them
        refused, statuses = [], []
        for _ in range(10):
            sock = running.connect()
            refused.append(sock)
            sock.sendall(request)
            time.sleep(0.05)  # the request sits unread in the server's buffer when it answers
            response = b""
            try:  # unlike read_all, a reset is a failure: a client may drop what it read before it
                while chunk := sock.recv(65536):
                    response += chunk
                statuses.append(error_of(response)[0])  # the 503, then the server's half-close
            except (OSError, ValueError, IndexError) as e:
                statuses.append(f"{e!r} after {response[:12]!r}")
        assert statuses == [503] * 10
        time.sleep(0.8)  # the clients keep their ends open: the server closes its own at the linger
        assert refusals.num_lingering == 0
        for sock in refused + held:
            sock.close()


MALFORMED_REQUESTS = {
    "a garbage request line": b"GARBAGE GARBAGE\r\n\r\n",
    "a control character in a header value": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n",
    "conflicting content lengths": b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "broken chunk framing": b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("case", list(MALFORMED_REQUESTS))
def test_bytes_the_parser_refuses_get_a_json_400_and_the_connection_closes(server, case):
    """uvicorn answered these with a plain-text "Invalid HTTP request received."."""
    with server.connect() as sock:
        sock.sendall(MALFORMED_REQUESTS[case])
        response = read_all(sock)
    status, error = error_of(response)
    assert status == 400 and error["type"] == "invalid_request_error" and "not valid HTTP/1.1" in error["message"]
    assert b"connection: close" in response.lower()
    assert b"200 OK" in server.get_health()


def test_a_malformed_request_pipelined_during_a_stream_writes_nothing_into_it(server):
    """uvicorn wrote its 400 into the middle of the running chunked response and closed it there."""
    with server.connect() as sock:
        sock.sendall(b"GET /stream?4 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, b"data: 0\n\n\r\n").startswith(b"HTTP/1.1 200")
        sock.sendall(b"GARBAGE GARBAGE\r\n\r\n")
        response = read_all(sock)
    assert b"400" not in response and response.endswith(b"data: 3\n\n\r\n0\r\n\r\n")  # ended whole, then closed


def test_a_request_before_a_malformed_one_in_the_same_read_is_answered(server):
    """uvicorn answered the malformed one at once and closed: the request before it got nothing."""
    with server.connect() as sock:
        sock.sendall(b"GET /stream?2 HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE GARBAGE\r\n\r\n")
        response = read_all(sock)
    assert response.startswith(b"HTTP/1.1 200") and response.endswith(b"data: 1\n\n\r\n0\r\n\r\n")
    assert b"400" not in response


def test_a_pipelined_body_that_breaks_during_a_stream_lets_the_stream_end_whole(server):
    """The request behind a running stream whose chunked body broke closed the connection at once,
    cutting the stream before it."""
    with server.connect() as sock:
        sock.sendall(b"GET /stream?4 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, b"data: 0\n\n\r\n").startswith(b"HTTP/1.1 200")
        sock.sendall(MALFORMED_REQUESTS["broken chunk framing"])
        response = read_all(sock)
    assert b"400" not in response and response.endswith(b"data: 3\n\n\r\n0\r\n\r\n")  # ended whole, then closed
    assert b"200 OK" in server.get_health()

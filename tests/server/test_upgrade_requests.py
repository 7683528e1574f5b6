"""Requests that ask to switch protocols (``Connection: Upgrade``, ``Upgrade: h2c``), over real
sockets against uvicorn with `helios serve`'s protocol (`helios.server.connection_limits`) in front
of `BodyGuard` and a tiny application that answers with the length of the body it got.

``curl --http2 -d BODY http://...`` sends such a POST. llhttp ends an upgrade request's message at
its headers and leaves the body to the new protocol, which uvicorn does not speak: the request was
served with an empty body ("the request body is empty" from the real routes), and body bytes that
came in a later read were parsed as the next request on the connection. Now a request with a body
and an Upgrade gets a JSON 400 and the connection closes; without a body the Upgrade is ignored.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from unittest import mock

import pytest
import uvicorn

from helios.server.body_guard import BodyGuard
from helios.server.connection_limits import ConnectionLimits, protocol_factory
from helios.server.serve import ServeOptions, bind, uvicorn_config
from server.test_connection_limits import read_all

WAIT_S = 10.0
UPGRADE = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
seen_paths: list[str] = []


async def length_app(scope, receive, send) -> None:
    """Answers every request with {"nbytes": the length of its body}; notes each path it serves."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    seen_paths.append(scope["path"])
    nbytes = 0
    while True:
        message = await receive()
        nbytes += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    body = json.dumps({"nbytes": nbytes}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port():
    limits = ConnectionLimits(head_timeout_s=WAIT_S, body_timeout_s=WAIT_S)
    with mock.patch.object(uvicorn.Config, "configure_logging"):  # leave this process's logging alone
        config = uvicorn_config(BodyGuard(length_app), ServeOptions(log_level="error"), limits)
    config.http = protocol_factory(limits)
    server = uvicorn.Server(config)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(WAIT_S)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def read_one(sock: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def assert_upgrade_refused(response: bytes) -> None:
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), response
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert "Upgrade: 'h2c'" in error["message"] and "--http1.1" in error["message"]


@pytest.mark.parametrize("framing", [b"Content-Length: 12\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_an_upgrade_request_with_a_body_gets_a_json_400(port, framing):
    """It was served with an empty body (200 {"nbytes": 0} here)."""
    body = b'{"a": "bcd"}' if framing.startswith(b"Content") else b'c\r\n{"a": "bcd"}\r\n0\r\n\r\n'
    with connect(port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + UPGRADE
                     + framing + b"\r\n" + body)
        assert_upgrade_refused(read_all(sock))


def test_the_body_of_an_upgrade_request_is_never_parsed_as_the_next_request(port):
    """Its body, arriving in a later read, was served as a request of its own."""
    seen_paths.clear()
    with connect(port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + UPGRADE
                     + b"Content-Length: %d\r\n\r\n" % len(SMUGGLED))
        assert_upgrade_refused(read_one(sock))
        try:
            sock.sendall(SMUGGLED)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed already
        assert read_all(sock) == b""
    assert "/smuggled" not in seen_paths


@pytest.mark.parametrize("length", [b"", b"Content-Length: 0\r\n"])
def test_an_upgrade_request_without_a_body_is_served_over_http11(port, length):
    with connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + UPGRADE + length + b"\r\n")
        response = read_one(sock)
        assert response.startswith(b"HTTP/1.1 200") and response.endswith(b'{"nbytes": 0}')
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")  # the connection still serves
        assert read_all(sock).endswith(b'{"nbytes": 2}')


def test_a_plain_post_is_served_whole(port):
    with connect(port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 12\r\nConnection: close\r\n\r\n" + b'{"a": "bcd"}')
        assert read_all(sock).endswith(b'{"nbytes": 12}')

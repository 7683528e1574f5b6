"""A light streaming client for benchmarks: asyncio raw sockets, HTTP/1.1 and SSE, in its own process.

The benchmarks measure the server; a client library that parses every line and header in Python
on the same cores (httpx costs about as much CPU per token as the server's own event loop) would
measure itself. This client writes one prebuilt request per connection (an asyncio protocol on
uvloop when it is installed) and reads the response with the least work that still times each
token: SSE events are split on blank lines and the ids of an event's `"token_ids":[...]` are
counted (not JSON-decoded). It runs in a process of its own (`ClientProcess`), so its CPU time is its own and
its GIL is not the measured process's.

    client = ClientProcess()                     # starts the process (spawn)
    streams, cpu_s = client.round(url, body, 64) # 64 concurrent streams of `body` (JSON bytes)
    client.close()

Each stream comes back as (submitted, [arrival of each token]) in `time.perf_counter` seconds (a
system-wide monotonic clock on Linux, so comparable with the caller's); `cpu_s` is the client's
own CPU time for the round.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from urllib.parse import urlsplit

TOKEN_IDS = b'"token_ids":['


def request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def count_token_ids(event: bytes) -> int:
    """Ids in the event's first `"token_ids":[...]` (0 when it has none)."""
    start = event.find(TOKEN_IDS)
    if start < 0:
        return 0
    start += len(TOKEN_IDS)
    end = event.find(b"]", start)
    inner = event[start:end]
    return inner.count(b",") + 1 if inner.strip() else 0


class _Stream(asyncio.Protocol):
    """One streamed request on its own connection. The server writes whole SSE events in each
    chunk of its chunked body, so the chunk framing (size lines) only ever falls between events,
    where it is ignored: events are split on blank lines and the ids of their `"token_ids":[...]`
    counted as the bytes arrive (`data_received`, no stream reader in between)."""

    def __init__(self, request: bytes, done: asyncio.Future):
        self._request = request
        self._done = done
        self._pending = b""
        self._has_head = False
        self.submitted = 0.0
        self.token_times: list[float] = []

    def connection_made(self, transport) -> None:
        self.submitted = time.perf_counter()
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        data = self._pending + data
        if not self._has_head:
            if b"\r\n\r\n" not in data:
                self._pending = data
                return
            head, data = data.split(b"\r\n\r\n", 1)
            self._has_head = True
            if head.split(b" ", 2)[1] != b"200":
                self._fail(f"HTTP {head.split(b' ', 2)[1].decode()}: {data[:2048].decode(errors='replace')}")
                return
        *events, self._pending = data.split(b"\n\n")
        for event in events:
            if b"event: error" in event:
                self._fail(event.decode(errors="replace"))
                return
            count = count_token_ids(event)
            if count:
                self.token_times.extend([now] * count)

    def connection_lost(self, error) -> None:
        if not self._done.done():
            self._done.set_result((self.submitted, self.token_times))

    def _fail(self, message: str) -> None:
        if not self._done.done():
            self._done.set_exception(RuntimeError(message))


async def _stream(host: str, port: int, request: bytes) -> tuple[float, list[float]]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, _ = await loop.create_connection(lambda: _Stream(request, done), host, port)
    try:
        return await done
    finally:
        transport.close()


async def _round(url: str, path: str, body: bytes, level: int):
    parts = urlsplit(url)
    request = request_bytes(parts.hostname, parts.port, path, body)
    return await asyncio.gather(*(_stream(parts.hostname, parts.port, request) for _ in range(level)))


def _run(coroutine):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _serve(connection) -> None:
    """The client process: answers ("round", url, path, body, level) until None."""
    while (message := connection.recv()) is not None:
        _, url, path, body, level = message
        cpu = time.process_time()
        try:
            streams = _run(_round(url, path, body, level))
            connection.send((streams, time.process_time() - cpu, None))
        except Exception as error:  # noqa: BLE001 - reported to the caller
            connection.send(([], time.process_time() - cpu, f"{type(error).__name__}: {error}"))


class ClientProcess:
    """The client in a process of its own (see the module docstring)."""

    description = "raw-socket asyncio (uvloop) HTTP/1.1 + SSE reader in its own process"

    def __init__(self):
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), name="bench-client", daemon=True)
        self._process.start()
        child.close()

    def round(self, url: str, body: bytes, level: int, path: str = "/v1/completions"):
        self._connection.send(("round", url, path, body, level))
        streams, cpu_s, error = self._connection.recv()
        if error is not None:
            raise RuntimeError(f"client: {error}")
        return streams, cpu_s

    def close(self) -> None:
        self._connection.send(None)
        self._process.join(30)

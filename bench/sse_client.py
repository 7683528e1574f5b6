"""A light streaming client for benchmarks: asyncio raw sockets, HTTP/1.1 and SSE, in its own process.

The benchmarks measure the server; a client library that parses every line and header in Python
on the same cores (httpx costs about as much CPU per token as the server's own event loop) would
measure itself. This client writes one prebuilt request per connection and reads the response
with the least work that still times each token: the chunked transfer encoding is undone, SSE
events are split on blank lines, and the ids of an event's `"token_ids":[...]` are counted (not
JSON-decoded). It runs in a process of its own (`ClientProcess`), so its CPU time is its own and
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


class _Events:
    """Splits SSE bytes into events and times the tokens they carry."""

    def __init__(self):
        self.pending = b""
        self.token_times: list[float] = []
        self.error: bytes | None = None

    def feed(self, data: bytes) -> None:
        self.pending += data
        if b"\n\n" not in self.pending:
            return
        *events, self.pending = self.pending.split(b"\n\n")
        now = time.perf_counter()
        for event in events:
            if event.startswith(b"event: error"):
                self.error = event
            count = count_token_ids(event)
            if count:
                self.token_times.extend([now] * count)


async def _read_chunked(reader: asyncio.StreamReader, events: _Events) -> None:
    while True:
        size = int((await reader.readline()).split(b";", 1)[0], 16)
        if size == 0:
            return
        events.feed((await reader.readexactly(size + 2))[:-2])


async def _stream(host: str, port: int, request: bytes) -> tuple[float, list[float]]:
    reader, writer = await asyncio.open_connection(host, port)
    submitted = time.perf_counter()
    writer.write(request)
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"HTTP {status.decode()}: {(await reader.read(2048)).decode(errors='replace')}")
        events = _Events()
        if b"transfer-encoding: chunked" in head.lower():
            await _read_chunked(reader, events)
        else:
            while data := await reader.read(65536):
                events.feed(data)
        if events.error is not None:
            raise RuntimeError(events.error.decode(errors="replace"))
        return submitted, events.token_times
    finally:
        writer.close()


async def _round(url: str, path: str, body: bytes, level: int):
    parts = urlsplit(url)
    request = request_bytes(parts.hostname, parts.port, path, body)
    return await asyncio.gather(*(_stream(parts.hostname, parts.port, request) for _ in range(level)))


def _serve(connection) -> None:
    """The client process: answers ("round", url, path, body, level) until None."""
    while (message := connection.recv()) is not None:
        _, url, path, body, level = message
        cpu = time.process_time()
        try:
            streams = asyncio.run(_round(url, path, body, level))
            connection.send((streams, time.process_time() - cpu, None))
        except Exception as error:  # noqa: BLE001 - reported to the caller
            connection.send(([], time.process_time() - cpu, f"{type(error).__name__}: {error}"))


class ClientProcess:
    """The client in a process of its own (see the module docstring)."""

    description = "raw-socket asyncio HTTP/1.1 + SSE reader in its own process"

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

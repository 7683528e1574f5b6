"""A light streaming client for benchmarks: asyncio raw sockets, HTTP/1.1 and SSE, in its own process.

The benchmarks measure the server; a client library that parses every line and header in Python
on the same cores (httpx costs about as much CPU per token as the server's own event loop) would
measure itself. This client writes one prebuilt request per connection (an asyncio protocol on
uvloop when it is installed) and reads the response with the least work that still times each
token: SSE events are split on blank lines and the ids of an event's `"token_ids":[...]` are
counted (not JSON-decoded). It runs in a process of its own (`ClientProcess`), so its CPU time is its own and
its GIL is not the measured process's.

Gathered reads (`gather_s` > 0, the benchmarks' default 0.5 ms): once some data arrived, the client
sleeps `gather_s` before it polls its sockets again, so that the writes the server makes for one
step (one per stream, spread over a millisecond or two) are read in one or a few wakeups instead of
one per write or two. A client on another machine costs the server's machine nothing; this one
shares two cores with it, and every wakeup of it can preempt the model worker, while a sleeping
reader also makes the server's loopback send cheaper (no reader to wake in the send's system
call). Every token is still timed when its bytes are read, at most `gather_s` after they arrived:
the time per token, a difference over the stream's first and last token, moves by at most
`gather_s / (n - 1)`. `gather_s` 0 reads as soon as the loop polls (the earlier client).

    client = ClientProcess()                     # starts the process (spawn)
    streams, cpu_s = client.round(url, body, 64) # 64 concurrent streams of `body` (JSON bytes)
    client.last_switches                         # the round's (voluntary, involuntary) context switches
    client.close()

Each stream comes back as (submitted, [arrival of each token]) in `time.perf_counter` seconds (a
system-wide monotonic clock on Linux, so comparable with the caller's); `cpu_s` is the client's
own CPU time for the round.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
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


class _Gather:
    """Delays the loop's next poll by `seconds` once data arrived (see the module docstring): a
    callback that sleeps, scheduled by the first read after a poll and run after that poll's reads."""

    def __init__(self, seconds: float):
        self._seconds = seconds
        self._is_scheduled = False

    def note_read(self) -> None:
        if self._seconds > 0 and not self._is_scheduled:
            self._is_scheduled = True
            asyncio.get_running_loop().call_soon(self._sleep)

    def _sleep(self) -> None:
        time.sleep(self._seconds)
        self._is_scheduled = False


class _Stream(asyncio.Protocol):
    """One streamed request on its own connection. The server writes whole SSE events in each
    chunk of its chunked body, so the chunk framing (size lines) only ever falls between events,
    where it is ignored: events are split on blank lines and the ids of their `"token_ids":[...]`
    counted as the bytes arrive (`data_received`, no stream reader in between)."""

    def __init__(self, request: bytes, done: asyncio.Future, gather: _Gather):
        self._request = request
        self._done = done
        self._gather = gather
        self._pending = b""
        self._has_head = False
        self.submitted = 0.0
        self.token_times: list[float] = []

    def connection_made(self, transport) -> None:
        self.submitted = time.perf_counter()
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self._gather.note_read()
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


async def _stream(host: str, port: int, request: bytes, gather: _Gather) -> tuple[float, list[float]]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, _ = await loop.create_connection(lambda: _Stream(request, done, gather), host, port)
    try:
        return await done
    finally:
        transport.close()


async def _round(url: str, path: str, body: bytes, level: int, gather_s: float):
    parts = urlsplit(url)
    request = request_bytes(parts.hostname, parts.port, path, body)
    gather = _Gather(gather_s)
    return await asyncio.gather(*(_stream(parts.hostname, parts.port, request, gather) for _ in range(level)))


def _run(coroutine):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _serve(connection) -> None:
    """The client process: answers ("round", url, path, body, level, gather_s) until None."""
    while (message := connection.recv()) is not None:
        _, url, path, body, level, gather_s = message
        cpu, switches = time.process_time(), _switches()
        try:
            streams = _run(_round(url, path, body, level, gather_s))
            error = None
        except Exception as failure:  # noqa: BLE001 - reported to the caller
            streams, error = [], f"{type(failure).__name__}: {failure}"
        after = _switches()
        connection.send((streams, time.process_time() - cpu, (after[0] - switches[0], after[1] - switches[1]), error))


def _switches() -> tuple[int, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw, usage.ru_nivcsw


class ClientProcess:
    """The client in a process of its own (see the module docstring)."""

    def __init__(self, gather_s: float = 0.0):
        self.gather_s = gather_s
        self.last_switches = (0, 0)
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), name="bench-client", daemon=True)
        self._process.start()
        child.close()

    @property
    def description(self) -> str:
        reads = (f"reads gathered {self.gather_s * 1e3:g} ms after data arrived" if self.gather_s > 0
                 else "reads at every poll")
        return f"raw-socket asyncio (uvloop) HTTP/1.1 + SSE reader in its own process, {reads}"

    def round(self, url: str, body: bytes, level: int, path: str = "/v1/completions"):
        self._connection.send(("round", url, path, body, level, self.gather_s))
        streams, cpu_s, self.last_switches, error = self._connection.recv()
        if error is not None:
            raise RuntimeError(f"client: {error}")
        return streams, cpu_s

    def close(self) -> None:
        self._connection.send(None)
        self._process.join(30)

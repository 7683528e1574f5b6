"""`chunk_writer`: for uvicorn's httptools response cycle, a chunk written straight to the transport
is byte for byte what uvicorn's own `send` writes for the same body message; whenever that send
would wait or do anything else (flow control paused, client gone or transport closed, response
complete or not started) it writes nothing and says so; other sends get no writer."""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import RequestResponseCycle as H11Cycle
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from helios.server.chunk_writer import chunk_writer

START = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}


class Transport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.is_closed = False

    def write(self, data: bytes) -> None:
        assert not self.is_closed, "a write to a closed transport (uvloop raises RuntimeError)"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.is_closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cycle() -> RequestResponseCycle:
    transport = Transport()
    scope = {"type": "http", "method": "POST", "http_version": "1.1", "path": "/", "query_string": b"",
             "client": ("127.0.0.1", 1), "headers": []}
    logger = logging.getLogger("test.chunk_writer")
    return RequestResponseCycle(scope, transport, FlowControl(transport), logger, logger, False, [],
                                asyncio.Event(), False, True, lambda: None)


def test_a_chunk_is_written_as_uvicorns_send_writes_it():
    async def scenario():
        ours, theirs = cycle(), cycle()
        writer = chunk_writer(ours.send)
        assert writer is not None and not writer(b"early")  # the response has not started
        for one in (ours, theirs):
            await one.send(START)
        for body in (b'data: {"a":1}\n\n', "data: é\n\n".encode() * 40):
            assert writer(body)
            await theirs.send({"type": "http.response.body", "body": body, "more_body": True})
        assert ours.transport.writes == theirs.transport.writes and len(ours.transport.writes) == 3

    asyncio.run(scenario())


def test_a_paused_gone_or_complete_connection_gets_nothing():
    async def scenario():
        one = cycle()
        writer = chunk_writer(one.send)
        await one.send(START)
        one.flow.pause_writing()
        assert not writer(b"x")  # flow control: the caller's awaited send waits for the drain
        one.flow.resume_writing()
        assert writer(b"x") and not writer(b"")
        one.disconnected = True
        assert not writer(b"x")
        one.disconnected = False
        one.transport.is_closed = True  # closed before uvicorn marked the cycle (a pipelined request's race)
        assert not writer(b"x")
        one.transport.is_closed = False
        await one.send({"type": "http.response.body", "body": b"", "more_body": False})
        assert not writer(b"x")
        assert len(one.transport.writes) == 3  # the headers, one chunk, the end

    asyncio.run(scenario())


def test_other_sends_get_no_writer():
    async def send(message) -> None:
        pass

    assert chunk_writer(send) is None
    assert chunk_writer(H11Cycle.send.__get__(object.__new__(H11Cycle))) is None

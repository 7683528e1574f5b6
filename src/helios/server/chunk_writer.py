"""Writing a streamed body's chunks straight to uvicorn's transport, without a coroutine per write.

A stream's per-step write through uvicorn's ASGI `send` costs a message dict, the send deadline's
coroutine and uvicorn's own (about 2-6 us of CPU on the event loop, the socket write aside); the
write itself never waits unless the connection is paused for flow control. `chunk_writer(send)`
gives, for uvicorn's httptools protocol (the one `helios serve` runs), a plain function that frames
one chunk of the chunked body exactly as uvicorn's `send` does and writes it to the transport at
once, returning True; it returns False, and writes nothing, whenever uvicorn's `send` would do
anything else: the connection paused for flow control (the caller then sends the message the
usual way, which waits under the send deadline), the client gone (or its transport closed, which
uvicorn does not always mark: the usual send then raises, and the response ends as a disconnect),
the response not started,
complete or not chunked. For any other server or protocol it is None (the caller always uses
`send`).
"""

from __future__ import annotations

from typing import Callable

from starlette.types import Send

ChunkWriter = Callable[[bytes], bool]


def chunk_writer(send: Send) -> ChunkWriter | None:
    """The chunk writer of uvicorn's httptools response cycle whose bound `send` this is, else None."""
    cycle = getattr(send, "__self__", None)
    if cycle is None or type(cycle).__module__ != "uvicorn.protocols.http.httptools_impl":
        return None
    if not all(hasattr(cycle, name) for name in _CYCLE_FIELDS):
        return None  # a uvicorn whose cycle differs from the one this was written against
    transport, flow = cycle.transport, cycle.flow

    def write(body: bytes) -> bool:
        if (flow.write_paused or cycle.disconnected or not cycle.response_started or cycle.response_complete
                or not cycle.chunked_encoding or not body or transport.is_closing()):
            return False
        transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        return True

    return write


_CYCLE_FIELDS = ("transport", "flow", "disconnected", "response_started", "response_complete", "chunked_encoding")

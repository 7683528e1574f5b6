"""What one connection may hold before its request reaches the application, and how many may be open.

uvicorn's httptools protocol buffers an unfinished header block without bound, waits forever for
the rest of a request line, a header block or a body, and accepts connections until the process runs
out of file descriptors. `protocol_factory(limits)` gives uvicorn (its ``http=`` setting) a
subclass of that protocol, one instance per connection, which adds:

- a cap on the request line plus header block (`max_head_nbytes`), each pipelined request's head
  counted on its own: bytes beyond it are never fed to the parser; the client gets 431 and the
  connection is closed;
- a deadline for the header block (`head_timeout_s`), from the accept (so a connection that sends
  nothing is covered) or, on a kept-alive connection, from the first byte after a response (a bare
  CRLF, which cancels uvicorn's keep-alive timer but begins no message, included): a client that
  sent part of a request gets 408, one that sent nothing else is closed quietly (as idle keep-alive
  connections are);
- a body deadline: the protocol puts `body_timeout_s` in the request's scope (`BODY_TIMEOUT_KEY`),
  and `helios.server.body_guard.BodyGuard` answers 408 when the body has not arrived in time,
  counted from the start of the request's task; a body still unfinished `BODY_GRACE_S` after that
  deadline (one no route reads, such as a GET's) closes the connection. This backstop starts again
  with the task of a pipelined request, which starts only when the response before it is complete;
- a cap on open connections (`max_connections`): one more is answered 503 at once, before its
  request is read, and is no longer treated as HTTP: what it sends is discarded, its write side is
  shut, and it is closed when the client closes or `REFUSAL_LINGER_S` later (so that a client that
  already sent its request reads the 503 rather than a reset; at most `MAX_LINGERING` linger at
  once, more are closed at once); the refusals are logged at most once per `REFUSAL_LOG_INTERVAL_S`;
- a request with a body that asks to switch protocols (``Connection: Upgrade`` with ``Upgrade: h2c``,
  as ``curl --http2`` sends on a plain-HTTP POST; anything but an accepted WebSocket upgrade) gets
  400 and the connection is closed: llhttp ends such a message at its headers and leaves the body to
  the new protocol, so uvicorn served it with an empty body and then parsed the body's later bytes
  as the next request. Without a body, the Upgrade header is ignored and the request served;
- bytes the parser refuses (not an HTTP/1.1 request: a garbage request line, a bad header, broken
  chunk framing) get 400 and the connection is closed, as uvicorn does, but with the server's JSON
  error body, and never written into an earlier response still being sent (uvicorn wrote its
  plain-text 400 into the middle of a pipelined stream, and dropped a request whose response had
  not started yet).

A deadline that passes while the server itself has paused reading (a pipelined request waiting for
the response before it, or a body the application has not taken yet) is not the client's delay: it
starts again. Nothing is written into a response still being sent on the connection: a limit passed
meanwhile (a pipelined head too large or too slow, or malformed) stops the parser, and the
connection is closed when that response ends. The error answers have the server's usual JSON error body.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
import logging
import resource
from dataclasses import dataclass, replace

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from helios.errors import HeliosError, OverloadedError, RequestError
from helios.frontend.responses.presentation import error_body
from helios.server.body_guard import BODY_TIMEOUT_KEY, RequestTimeout
from helios.server.defaults import (
    DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEAD_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEAD_NBYTES,
)

BODY_GRACE_S = 2.0  # after the body deadline: time for BodyGuard's 408 to go out first
REFUSAL_LOG_INTERVAL_S = 10.0
REFUSAL_LINGER_S = 1.0  # a refused connection stays open this long at most, for its client to read the 503
MAX_LINGERING = 64  # refused connections left to linger at once; beyond it, closed at once
FD_RESERVE = 256  # descriptors kept beside the connections: listeners, pipes, logs, the core's files
logger = logging.getLogger("uvicorn.error")


@dataclass(frozen=True)
class ConnectionLimits:
    max_head_nbytes: int = DEFAULT_MAX_HEAD_NBYTES  # request line plus header block
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class HeadTooLarge(RequestError):
    """The request line and header block are larger than the server's limit (``--max-header-bytes``)."""

    http_status = 431


class MalformedRequest(RequestError):
    """Bytes on the connection that httptools does not parse as an HTTP/1.1 request."""


class UpgradeWithBody(RequestError):
    """A request with a body that asks to switch to a protocol this server does not speak (HTTP 400)."""

    def __init__(self, upgrade: bytes):
        super().__init__(f"this server speaks HTTP/1.1 only and cannot switch protocols (Upgrade: "
                         f"{upgrade[:64].decode('latin-1')!r}) for a request with a body: send it without "
                         "the Upgrade header (curl: --http1.1)")


class ConnectionCapReached(OverloadedError):
    """The server holds as many open connections as it may (``--max-connections``)."""

    http_status = 503


def error_bytes(error: HeliosError) -> bytes:
    """A whole HTTP/1.1 response with `error`'s JSON body, closing the connection."""
    body = json.dumps(error_body(error)).encode()
    status = http.HTTPStatus(error.http_status)
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class RefusalLog:
    """Counts connections refused at the cap and logs them: the first at once, then at most one line
    per `interval_s` with the count since the last line. Owned by the event loop's thread."""

    def __init__(self, max_connections: int, interval_s: float = REFUSAL_LOG_INTERVAL_S):
        self.max_connections = max_connections
        self.interval_s = interval_s
        self.num_unlogged = 0
        self.num_lingering = 0  # refused connections not yet closed
        self._timer: asyncio.TimerHandle | None = None

    def note(self, loop: asyncio.AbstractEventLoop) -> None:
        self.num_unlogged += 1
        if self._timer is None:
            self._flush(loop)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.num_unlogged:
            self._timer = None
            return
        logger.warning("refused %d connection(s): %d are open, the limit (--max-connections)",
                       self.num_unlogged, self.max_connections)
        self.num_unlogged = 0
        self._timer = loop.call_later(self.interval_s, self._flush, loop)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module docstring. One per connection;
    `refusals` is shared by every connection of one server."""

    def __init__(self, config, server_state, app_state, _loop=None, *, limits: ConnectionLimits,
                 refusals: RefusalLog):
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.refusals = refusals
        self.is_refused = False
        self.is_discarding = False  # the parser is fed no more: the connection closes after the running response
        self.is_awaiting_head = True  # the next byte belongs to a request line or header block
        self.is_head_begun = False  # a byte of the awaited head has arrived
        self.head_nbytes = 0  # bytes received while awaiting this head (at most one read undercounted)
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        num_open = len(self.server_state.connections)
        if num_open >= self.limits.max_connections:
            self._refuse(transport, num_open)
            return
        super().connection_made(transport)
        self._arm(self.limits.head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.is_refused:
            self._disarm()
            self.refusals.num_lingering -= 1
            return
        self._disarm()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:
        if self.is_refused:
            self.transport.close()
            return True
        return super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self.is_refused or self.is_discarding:
            return
        if self.is_awaiting_head and self.deadline is None:
            # Any byte cancels uvicorn's keep-alive timer, and bare CR/LF between requests begins no
            # message: without this, "\r\n" after a response would leave the connection with no deadline.
            self._arm(self.limits.head_timeout_s)
        while data:
            if not self.is_awaiting_head:
                super().data_received(data)
                return
            room = self.limits.max_head_nbytes - self.head_nbytes
            if room <= 0:
                self._answer(HeadTooLarge("the request line and headers are larger than this server's limit of "
                                          f"{self.limits.max_head_nbytes} bytes"))
                return
            # Feed what fits. A head that ends inside it continues with the rest; a message that ends
            # inside it resets the count, so the next pipelined head is judged on its own bytes.
            fed, data = data[:room], data[room:]
            self.head_nbytes += len(fed)
            super().data_received(fed)
            if self.is_discarding or self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # refused by the parser (`send_400_response`), or taken over by the WebSocket protocol

    # Parser callbacks (httptools calls them while `data_received` feeds it)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.is_head_begun = True
        if self.deadline is None:  # a kept-alive connection's next request: its head's deadline starts
            self._arm(self.limits.head_timeout_s)

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and not self._should_upgrade() and self._has_body():
            # llhttp skips this message's body (the new protocol's bytes): it cannot be served.
            self.is_awaiting_head = False
            self._answer(UpgradeWithBody(self._get_upgrade() or b""))
            self.is_discarding = True
            return
        super().on_headers_complete()
        self.is_awaiting_head = False
        self._disarm()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # the WebSocket protocol takes the connection over
        self.scope[BODY_TIMEOUT_KEY] = self.limits.body_timeout_s  # type: ignore[literal-required]
        self._arm(self._body_backstop_s())

    def on_message_complete(self) -> None:
        if self.is_discarding:
            return  # a request refused at its headers (`UpgradeWithBody`): it has no cycle of its own
        super().on_message_complete()
        self._disarm()
        self.is_awaiting_head, self.is_head_begun, self.head_nbytes = True, False, 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.is_discarding and not self.pipeline and not self.transport.is_closing():
            self.transport.close()  # the response a malformed pipelined request was dropped behind ended

    def _start_asgi_task(self, cycle, app) -> None:
        super()._start_asgi_task(cycle, app)
        if cycle is self.cycle and not self.is_awaiting_head and not self.transport.is_closing():
            # BodyGuard's deadline starts with the request's task, which a pipelined request only
            # gets once the response before it is complete: the backstop starts again with it.
            self._arm(self._body_backstop_s())

    def _has_body(self) -> bool:
        return any(name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0") != b"")
                   for name, value in self.headers)

    # Deadlines: one timer per connection, for the head or the body awaited now

    def _body_backstop_s(self) -> float:
        return self.limits.body_timeout_s + BODY_GRACE_S

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._on_deadline, seconds)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _on_deadline(self, seconds: float) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server is not reading: not the client's delay
            self._arm(seconds)
        elif self.is_awaiting_head:
            if self.is_head_begun:
                self._answer(RequestTimeout(f"the request line and headers did not arrive within {seconds:g} s"))
            elif not self._is_responding():  # nothing sent yet, or only CR/LF: closed quietly, as when idle
                self.transport.close()
            # else: a response is running; uvicorn's keep-alive timer starts when it completes
        elif any(cycle is self.cycle for cycle, _ in self.pipeline):
            self._arm(seconds)  # the request's task (and BodyGuard's deadline) has not started yet
        else:  # a body no route took within its deadline
            self.transport.close()

    def _is_responding(self) -> bool:
        """Whether an earlier request's response is still running (or waiting to run) on this connection."""
        return self.cycle is not None and not self.cycle.response_complete

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer when the parser refuses the bytes (`msg`, its plain-text body, is not
        used). A head that never completed is answered as the limits are (`_answer`): after an earlier
        response still being sent, nothing is written, and the connection closes when it ends. A
        request whose body broke off (chunk framing) cannot be served: 400 while nothing was sent for
        it or before it; queued behind a response still being sent, it is dropped, and the connection
        closes when that response ends (`on_response_complete`); once its own response has started,
        the connection is closed at once, since any bytes would land inside it."""
        error = MalformedRequest("the request is not valid HTTP/1.1 (its request line, headers or chunked "
                                 "body framing could not be parsed)")
        if self.is_awaiting_head or self.cycle is None:
            self._answer(error)
        elif self.cycle.response_started:
            self._disarm()
            self.is_discarding = True
            self.transport.close()
        elif any(cycle is self.cycle for cycle, _ in self.pipeline):
            self._disarm()
            for entry in [entry for entry in self.pipeline if entry[0] is self.cycle]:
                self.pipeline.remove(entry)
            self.is_discarding = True
        else:
            self._disarm()
            self.is_discarding = True
            self.transport.write(error_bytes(error))
            self.transport.close()

    def _answer(self, error: HeliosError) -> None:
        self._disarm()
        if self._is_responding():
            # Bytes written now would land inside that response: let it finish, then close, and
            # feed the parser nothing more meanwhile.
            self.cycle.keep_alive = False
            self.is_discarding = True
            return
        self.transport.write(error_bytes(error))
        self.transport.close()

    def _refuse(self, transport, num_open: int) -> None:
        """503, then no more HTTP: what the client sends is discarded, the write side is shut, and the
        connection is closed when the client closes or `REFUSAL_LINGER_S` later, so that the client
        reads the 503 rather than a reset caused by its unread request."""
        self.is_refused = True
        self.transport = transport
        transport.write(error_bytes(ConnectionCapReached(
            f"the server has {num_open} open connections, its limit; retry later")))
        self.refusals.note(self.loop)
        self.refusals.num_lingering += 1
        if self.refusals.num_lingering > MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.deadline = self.loop.call_later(REFUSAL_LINGER_S, transport.close)


def protocol_factory(limits: ConnectionLimits):
    """What `uvicorn.Config(http=...)` takes: builds one `GuardedHttpToolsProtocol` per connection."""
    return functools.partial(GuardedHttpToolsProtocol, limits=limits, refusals=RefusalLog(limits.max_connections))


def fit_to_fd_limit(limits: ConnectionLimits) -> ConnectionLimits:
    """`limits` with room for its connections in the process's file descriptors: raises the soft
    limit towards the hard one where needed; lowers `max_connections` (logged) where even that is short,
    so that the cap, not the accept loop running out of descriptors, refuses connections."""
    needed = limits.max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return limits
    fitted = max(1, soft - FD_RESERVE)
    logger.warning("--max-connections %d does not fit the open-file limit (%d); serving at most %d connections",
                   limits.max_connections, soft, fitted)
    return replace(limits, max_connections=fitted)

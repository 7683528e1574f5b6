"""What one connection may hold before its request reaches the application, and how many may be open.

uvicorn's httptools protocol buffers an unfinished header block without bound, waits forever for
the rest of a request line, a header block or a body, and accepts connections until the process runs
out of file descriptors. `protocol_factory(limits)` gives uvicorn (its ``http=`` setting) a
subclass of that protocol, one instance per connection, which adds:

- a cap on the request line plus header block (`max_head_nbytes`): bytes beyond it are never fed to
  the parser; the client gets 431 and the connection is closed;
- a deadline for the header block (`head_timeout_s`), from the accept (so a connection that sends
  nothing is covered) or, on a kept-alive connection, from the next request's first byte: a client
  that sent part of a request gets 408, one that sent nothing is closed quietly (as idle
  keep-alive connections are);
- a body deadline: the protocol puts `body_timeout_s` in the request's scope (`BODY_TIMEOUT_KEY`),
  and `helios.server.body_guard.BodyGuard` answers 408 when the body has not arrived in time; a
  body still unfinished `BODY_GRACE_S` later (one no route reads, such as a GET's) closes the
  connection;
- a cap on open connections (`max_connections`): one more is answered 503 at once and closed,
  before its request is read; the refusals are logged at most once per `REFUSAL_LOG_INTERVAL_S`.

A deadline that passes while the server itself has paused reading (a pipelined request waiting for
the response before it, or a body the application has not taken yet) is not the client's delay: it
starts again. The error answers have the server's usual JSON error body.
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
from helios.server.body_guard import BODY_TIMEOUT_KEY, DEFAULT_BODY_TIMEOUT_S, RequestTimeout

DEFAULT_MAX_HEAD_NBYTES = 64 * 1024
DEFAULT_HEAD_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 4096
BODY_GRACE_S = 2.0  # after the body deadline: time for BodyGuard's 408 to go out first
REFUSAL_LOG_INTERVAL_S = 10.0
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
        self.is_awaiting_head = True  # the next byte belongs to a request line or header block
        self.is_head_begun = False  # a byte of the awaited head has arrived
        self.head_nbytes = 0  # bytes received while awaiting this head (at most one read undercounted)
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        num_open = len(self.server_state.connections)
        if num_open >= self.limits.max_connections:
            self.is_refused = True
            transport.write(error_bytes(ConnectionCapReached(
                f"the server has {num_open} open connections, its limit; retry later")))
            transport.close()
            self.refusals.note(self.loop)
            return
        super().connection_made(transport)
        self._arm(self.limits.head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.is_refused:
            return
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.is_awaiting_head:
            super().data_received(data)
            return
        room = self.limits.max_head_nbytes - self.head_nbytes
        if len(data) <= room:
            self.head_nbytes += len(data)
            super().data_received(data)
            return
        if room > 0:  # feed what fits: a head that ends inside it continues with the rest
            self.head_nbytes += room
            super().data_received(data[:room])
        if self.transport.is_closing():
            return
        if self.is_awaiting_head:
            self._answer(HeadTooLarge("the request line and headers are larger than this server's limit of "
                                      f"{self.limits.max_head_nbytes} bytes"))
            return
        super().data_received(data[room:])

    # Parser callbacks (httptools calls them while `data_received` feeds it)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.is_head_begun = True
        if self.deadline is None:  # a kept-alive connection's next request: its head's deadline starts
            self._arm(self.limits.head_timeout_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.is_awaiting_head = False
        self._disarm()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # the WebSocket protocol takes the connection over
        self.scope[BODY_TIMEOUT_KEY] = self.limits.body_timeout_s  # type: ignore[literal-required]
        self._arm(self.limits.body_timeout_s + BODY_GRACE_S)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self.is_awaiting_head, self.is_head_begun, self.head_nbytes = True, False, 0

    # Deadlines: one timer per connection, for the head or the body awaited now

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
        elif self.is_awaiting_head and self.is_head_begun:
            self._answer(RequestTimeout(f"the request line and headers did not arrive within {seconds:g} s"))
        else:  # nothing sent yet, or a body no route took within its deadline
            self.transport.close()

    def _answer(self, error: HeliosError) -> None:
        self.transport.write(error_bytes(error))
        self.transport.close()


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

"""HTTP responses of submitted requests: JSON bodies and SSE streams that own their admission permit.

A submitted request's `ResponseBridge` holds the request's permit; the response classes here close
the bridge when the ASGI response is over (body fully sent, or the client gone, or the task
cancelled at shutdown), in a `finally` that runs on every path. Closing before the terminal event
cancels the request in the engine; the permit is released once the engine confirmed the end.

- JSON: waits for the terminal item while watching the connection; a client that disconnects
  cancels its request. The status is the error class's (`error.http_status`) for failures:
  admission rejection 503, execution failure 500.
- Send timeout: a write that the client does not take within `send_timeout_s` (it stopped reading
  and the connection's buffers are full) drops the response: the connection is closed, the request
  cancelled and the permit released once the engine confirmed the end. A reader that pauses for
  less than that and resumes loses nothing (output waits in the bridge's queue meanwhile).
- Shutdown: a response whose connection the server drops after the drain deadline (which already
  gave running streams their error event) ends as a disconnect, quietly (`helios.server.serve`
  aborts the connection); one that uvicorn's backstop cancels after that ends quietly too (no
  traceback).
- SSE: headers go out at once; each arrival of items becomes one write, and steps that piled up
  while the reader was slow are presented as one run (one set of chunks with their ids, text and
  log-probabilities concatenated in order, `helios.frontend.responses.step_run`) instead of one
  per token. The stream ends with the presenter's terminal chunks and
  ``[DONE]``, or with exactly one ``event: error`` (its ``type`` tells admission rejection from
  execution failure) and no ``[DONE]``; the last chunk and the end of the body are one write.
  `SSEResponse` is a plain ASGI response (no async generator, no task group): its task awaits the
  bridge, presents and writes. The start and the last message pass through the application's
  middlewares; the per-step writes in between go to the server's own send when the server put it
  in the scope (`TRANSPORT_SEND`, see `with_transport_send`): the middlewares here only look at
  the start (status, counters), and each layer they add costs a coroutine per write. While the
  task waits for items, steps that arrive are presented and written in the event loop's delivery
  itself (`DirectWrites`, through `ResponseBridge.read_directly`): no task wakeup per stream per
  step; under uvicorn's httptools protocol a per-step chunk goes straight to the transport when
  the connection is not paused (`helios.server.chunk_writer`: no coroutine per write). A client
  that disconnects ends the response at once (a watcher task on `receive`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Callable

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helios.frontend.responses.presentation import StreamPresenter, error_body, error_status
from helios.frontend.session import PreparedRequest
from helios.server.bridge import Failure, ResponseBridge
from helios.server.chunk_writer import chunk_writer
from helios.server.defaults import DEFAULT_SEND_TIMEOUT_S
from helios.server.echo import clipped_runs
from helios.server.step_writes import DirectWrites, Handoff, present  # noqa: F401 (Handoff: re-exported)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TRANSPORT_SEND = "helios.transport_send"  # scope key: the server's send, below the app's middlewares
logger = logging.getLogger("uvicorn.error")  # uvicorn configures and formats this one


class SendTimeout(Exception):
    """The client took none of a response write within the send timeout (internal to this module)."""


class SendDeadline:
    """`send` bounded by `timeout_s` per message, without a timer per message: a send notes when it
    started, and one loop timer per response (armed by the first send, re-armed only while a send
    is in progress) cancels the sending task once a send is `timeout_s` old, which that send turns
    into `SendTimeout`. A send that completes costs a clock read and no timer operation."""

    def __init__(self, send: Send, timeout_s: float):
        self._send = send
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._started: float | None = None  # loop time the send in progress started
        self._task: asyncio.Task | None = None  # the task its sends run in (one response's)
        self._timer: asyncio.TimerHandle | None = None
        self._has_expired = False

    async def __call__(self, message) -> None:
        await self.send_via(self._send, message)

    async def send_via(self, send: Send, message) -> None:
        """`send(message)` under this deadline (another send of the same connection). Every send
        of one deadline runs in one task (the response's), looked up once."""
        if self._task is None:
            self._task = asyncio.current_task()
        self._started = started = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(started + self._timeout_s, self._check)
        try:
            await send(message)
        except asyncio.CancelledError:
            if self._has_expired and self._task is not None:
                self._task.uncancel()
                raise SendTimeout from None
            raise
        finally:
            self._started = None

    def _check(self) -> None:
        self._timer = None
        started = self._started
        if started is None or self._task is None:  # idle: the next send arms the timer again
            return
        due = started + self._timeout_s
        if self._loop.time() >= due:
            self._has_expired = True
            self._task.cancel()
        else:
            self._timer = self._loop.call_at(due, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass(frozen=True)
class Lease:
    """What a response needs besides its content: the bridge it closes when over, the send
    timeout, and whether the server is dropping its last connections (shutdown)."""

    bridge: ResponseBridge
    send_timeout_s: float | None = DEFAULT_SEND_TIMEOUT_S
    is_dropping: Callable[[], bool] = lambda: False
    others: tuple[ResponseBridge, ...] = ()  # the other choices' bridges of one response (fan-out)

    def close(self) -> None:
        self.bridge.close()
        for bridge in self.others:
            bridge.close()


_CLOSED_UVLOOP_TRANSPORT = "unable to perform operation on"  # uvloop's RuntimeError on a closed handle


def is_client_gone(error: BaseException, scope: Scope) -> bool:
    """Whether `error`, raised while writing this request's response, says that its client is gone:
    a connection error (reset, broken pipe), or a write to a transport that is closed (uvloop raises
    RuntimeError there). uvicorn marks a request disconnected when its connection is lost, but not
    one that was running while a pipelined request behind it was read (its writes then reach the
    closed transport); where uvicorn's send is in the scope (`TRANSPORT_SEND`), its transport is
    checked and the request marked disconnected, as uvicorn would have, so that uvicorn ends it
    quietly. Any other RuntimeError or OSError is not a disconnect."""
    if not isinstance(error, (RuntimeError, OSError)):
        return False
    cycle = getattr(scope.get(TRANSPORT_SEND), "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:  # another server, or no transport send in the scope: the error alone decides
        return isinstance(error, ConnectionError) or _CLOSED_UVLOOP_TRANSPORT in str(error)
    if not transport.is_closing() or not (isinstance(error, OSError) or _CLOSED_UVLOOP_TRANSPORT in str(error)):
        return False
    if hasattr(cycle, "disconnected"):
        cycle.disconnected = True
    return True


class ClientGone(Exception):
    """A write that found its response's client gone (`is_client_gone`), raised by the write itself
    (`checked_send`) in place of the transport's error, so that only a failed write, never another
    fault of the response that happens while the transport closes, counts as a disconnect."""


def checked_send(send: Send, scope: Scope) -> Send:
    """`send` whose writes raise `ClientGone` where the transport's error says the client is gone."""

    async def checked(message: Message) -> None:
        try:
            await send(message)
        except (RuntimeError, OSError) as error:
            if is_client_gone(error, scope):
                raise ClientGone(str(error)) from error
            raise

    return checked


async def send_leased(call, lease: Lease, scope: Scope, receive: Receive, send: Send) -> None:
    """Runs the response's own ASGI `call` with a timed send and closes the bridge on every path. A
    write that finds the client gone (`ClientGone`) ends the response quietly, as a disconnect."""
    send = checked_send(send, scope)
    deadline = None if lease.send_timeout_s is None else SendDeadline(send, lease.send_timeout_s)
    try:
        await call(scope, receive, send if deadline is None else deadline)
    except ClientGone as error:
        logger.debug("response %s ended: its client is gone (%s)", lease.bridge.request_id, error)
    except SendTimeout:
        logger.warning("response %s dropped: its client took nothing for %.0f s",
                       lease.bridge.request_id, lease.send_timeout_s)
    except asyncio.CancelledError:
        if not lease.is_dropping():
            raise
        # The server drops the connections left after the drain deadline: the connection closes.
    finally:
        if deadline is not None:
            deadline.close()
        lease.close()


class ClientGoneGuard:
    """ASGI middleware: a response whose write finds its client gone (`checked_send`), leased or not,
    ends quietly as a disconnect (one DEBUG line) instead of as an application error with a
    traceback. Installed inside the access log, which then logs the request as 499."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, checked_send(send, scope))
        except ClientGone as error:
            logger.debug("%s %s ended: its client is gone (%s)", scope.get("method"), scope.get("path"), error)


def error_response(error: BaseException) -> JSONResponse:
    """The OpenAI-style error body with the status the error's class decides; values the message
    echoes from the request are bounded (`helios.server.echo`)."""
    body = error_body(error)
    body["error"]["message"] = clipped_runs(body["error"]["message"])
    return JSONResponse(body, status_code=error_status(error))


class LeasedJSONResponse(JSONResponse):
    """A JSON response that closes its bridge (releasing the permit) once it is over."""

    def __init__(self, content, status_code: int, lease: Lease):
        super().__init__(content, status_code=status_code)
        self._lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_leased(super().__call__, self._lease, scope, receive, send)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def json_response(lease: Lease, prepared: PreparedRequest, receive: Receive) -> Response:
    """Waits for the end of a non-streamed request; a client that disconnects meanwhile cancels it."""
    bridge = lease.bridge
    waiter = asyncio.ensure_future(bridge.terminal())
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((waiter, watcher), return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            bridge.cancel()
        terminal = await waiter
        if isinstance(terminal, Failure):
            return LeasedJSONResponse(error_body(terminal.error), terminal.error.http_status, lease)
        return LeasedJSONResponse(prepared.response_body(terminal), 200, lease)
    except BaseException:
        waiter.cancel()
        bridge.close()
        raise
    finally:
        watcher.cancel()


def stream_response(lease: Lease, presenter: StreamPresenter) -> Response:
    return SSEResponse(lease, presenter)


def with_transport_send(app: ASGIApp) -> ASGIApp:
    """`app` with the server's own send in each HTTP scope (`TRANSPORT_SEND`), for `SSEResponse`'s
    per-step writes. Only for an application whose middlewares leave body messages unchanged."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[TRANSPORT_SEND] = send
        await app(scope, receive, send)

    return asgi


async def stream_leased(stream, lease: Lease, scope: Scope, receive: Receive, send: Send) -> None:
    """`send_leased(stream, ...)` for a streamed response: a client that disconnects (a watcher
    task on `receive`) cancels the stream's task, and the response then ends quietly."""
    task = asyncio.current_task()
    is_streaming = True

    def on_disconnect(watcher: asyncio.Future) -> None:
        if is_streaming and not watcher.cancelled():
            task.cancel()

    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    watcher.add_done_callback(on_disconnect)
    try:
        await send_leased(stream, lease, scope, receive, send)
    except asyncio.CancelledError:
        if not (watcher.done() and not watcher.cancelled()):
            raise
        task.uncancel()  # the client is gone: the response ends quietly
    finally:
        is_streaming = False
        if watcher.done() and not watcher.cancelled():
            watcher.exception()  # a receive that failed ended the stream like a disconnect
        watcher.cancel()


def step_writer(scope: Scope, send: Send) -> Send:
    """The send of a stream's writes between its start and its last message: the server's own
    (`TRANSPORT_SEND`) when it is in the scope, under `send`'s deadline when `send` has one."""
    transport = scope.get(TRANSPORT_SEND)
    if transport is None:
        return send
    transport = checked_send(transport, scope)  # a write finding the client gone raises ClientGone
    if isinstance(send, SendDeadline):
        return functools.partial(send.send_via, transport)
    return transport


class LeasedSSE(Response):
    """An event stream served under a `Lease` (`stream_leased`): the base of the single- and
    multi-choice streams, which define `_stream`."""

    media_type = "text/event-stream"

    def __init__(self, lease: Lease):
        self.status_code = 200
        self.background = None
        self.raw_headers = list(_SSE_RAW_HEADERS)
        self._lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await stream_leased(self._stream, self._lease, scope, receive, send)

    async def _open(self, scope: Scope, send: Send):
        """Sends the response start; returns (the per-step writer, uvicorn's transport send or None,
        the direct chunk writer or None)."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        transport = scope.get(TRANSPORT_SEND)
        return step_writer(scope, send), transport, None if transport is None else chunk_writer(transport)


class SSEResponse(LeasedSSE):
    """A streamed response (see the module docstring); closes its bridge once it is over."""

    def __init__(self, lease: Lease, presenter: StreamPresenter):
        super().__init__(lease)
        self._presenter = presenter

    async def _stream(self, scope: Scope, _receive: Receive, send: Send) -> None:
        """`send`: the middleware chain's, timed (`SendDeadline`) unless the lease has no timeout."""
        write, transport, raw = await self._open(scope, send)
        presenter, bridge = self._presenter, self._lease.bridge
        start = presenter.sse_start()
        if start and not (raw is not None and raw(start)):
            await write({"type": "http.response.body", "body": start, "more_body": True})
        direct = None if transport is None else DirectWrites(presenter, write, bridge, raw)
        bridge.read_directly(direct)
        try:
            while True:
                items = await bridge.next_items()
                handoff = None if direct is None else direct.take_handoff()
                if handoff is not None:
                    if handoff.last is not None:
                        await send({"type": "http.response.body", "body": handoff.last, "more_body": False})
                        return
                    await handoff.finish()
                if not items:
                    continue
                chunk, is_done = present(presenter, items)
                if is_done:
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return
                if raw is None or not raw(chunk):
                    await write({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            bridge.read_directly(None)
            if direct is not None:
                direct.close()


_SSE_RAW_HEADERS = (*((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in SSE_HEADERS.items()),
                    (b"content-type", b"text/event-stream; charset=utf-8"))  # no length: the body is chunked

"""Running the HTTP server: uvicorn (uvloop and httptools when installed) on a socket bound here.

`serve(runtime, options, owned_by)` blocks until SIGTERM or SIGINT. Shutdown order: uvicorn stops
accepting and lets open connections finish for `drain_seconds` (`helios serve --drain-seconds`;
by default the specification's five seconds);
at that deadline every response still running ends with one ``event: error`` ("server shutting
down"; a JSON response waiting for its end gets 503 with the same error) and its request is
cancelled; connections still open `DROP_GRACE_SECONDS` later (clients that read nothing, their
responses' last writes waiting, whether or not their generation had finished) are dropped quietly:
their transports are aborted, so uvicorn sees each client gone and its response ends as a
disconnect, and one INFO line counts them. uvicorn's own deadline, which cancels tasks with
ERROR lines, stays a backstop `BACKSTOP_SECONDS` after that. Only then does the app's lifespan stop the model worker, which returns after its
current round drained, so device resources outlive every execution that uses them. After that
uvicorn re-raises the signal, so the process ends the way the signal says (status -15 / 143 for
SIGTERM; SIGINT exits through `KeyboardInterrupt`). SIGHUP (a closed terminal) is handled as SIGTERM
is, unless ignored (nohup). A second SIGINT skips the rest of the drain: running responses end with
the error event at once, and the model worker is still stopped before the exit.

If the model worker dies (a fault of the worker itself, never of one request: those fail alone),
`/health` answers 503 at once and the server shuts down the same way and `serve` raises
`WorkerDied`, so the process exits non-zero (status 9) and a supervisor restarts it.

The socket is bound before uvicorn starts so that port 0 works and the printed address is exact
(`helios serve` binds it before the model loads, so that a taken port fails at once; it listens
only once serving). Each connection is uvicorn's httptools protocol with the header-size cap, the head and body
deadlines and the connection cap of `helios.server.connection_limits` (`options.connection_limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field

import uvicorn

from helios.errors import ExecutionError, HeliosError
from helios.frontend.images.decode import ImageLimits
from helios.runtime.stall_watch import DEFAULT_LIVENESS_TIMEOUT_S
from helios.runtime.service import Runtime
from helios.server.engine_process import EngineProcessRuntime
from helios.server.frontend_ahead import FrontendAhead
from helios.runtime.host_heap import hold_freed_memory
from helios.server.heap import freeze_startup_heap
from helios.server.access import access_logger
from helios.server.app import create_app
from helios.server.defaults import DEFAULT_MAX_BODY_NBYTES, DEFAULT_SEND_TIMEOUT_S, DRAIN_SECONDS
from helios.server.connection_limits import ConnectionLimits, fit_to_fd_limit, protocol_factory
from helios.server.responses import with_transport_send
from helios.server.service import ServedModel
from helios.server.start_trace import mark

BACKLOG = 2048  # connections the kernel holds for the accept loop
DROP_GRACE_SECONDS = 1  # after the drain deadline: time for the error events to reach their clients
BACKSTOP_SECONDS = 2  # after the drop: uvicorn cancels the tasks still running (none should be)
logger = logging.getLogger("uvicorn.error")  # uvicorn configures and formats this one


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 picks a free port
    queue_capacity: int = 256
    frontend_workers: int = 2
    drain_seconds: float = DRAIN_SECONDS  # `helios serve --drain-seconds`
    log_level: str = "info"
    access_log: bool = False
    max_body_nbytes: int = DEFAULT_MAX_BODY_NBYTES
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    stream_interval: int = 1  # steps per SSE write after a stream's first (`helios.server.bridge`)
    api_key: str | None = None  # /v1/ requests without it get 401
    served_names: tuple[str, ...] = ()  # operator names (served id first); empty: the core's
    image_limits: ImageLimits = field(default_factory=ImageLimits)  # per-request image bounds
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)  # head size, deadlines, cap
    liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S  # an in-process engine's stall timeout (`ServedModel`)


class ListenError(HeliosError):
    """The server cannot listen on the requested address."""


class WorkerDied(ExecutionError):
    """The model worker stopped serving; the server shut down so that a supervisor restarts it."""


class HeliosServer(uvicorn.Server):
    """uvicorn with the shutdown of the module docstring: error events at the drain deadline, and
    an exit when the model worker died."""

    def __init__(self, config: uvicorn.Config, served: ServedModel, drain_seconds: float):
        super().__init__(config)
        self.served = served
        self.drain_seconds = drain_seconds
        self.has_worker_died = False
        self.worker_failure = ""  # why, once it died

    async def on_tick(self, counter: int) -> bool:
        if not self.has_worker_died and not self.served.is_healthy:
            self.has_worker_died = True
            self.worker_failure = getattr(self.served.engine, "failure", None) or "no cause reported"
            logger.error("the model worker died (%s); shutting down so that a supervisor restarts the server",
                         self.worker_failure)
            return True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(self.drain_seconds, self._interrupt)
        drop = loop.call_later(self.drain_seconds + DROP_GRACE_SECONDS, self._drop_connections)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()
            drop.cancel()
        if self.force_exit:  # a second SIGINT: uvicorn drops the drain and the app's shutdown
            self._interrupt("second interrupt")
            await self.lifespan.shutdown()  # the model worker stops all the same
        logger.info("helios serve: shut down")

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's SIGINT and SIGTERM handling, and SIGHUP (a closed terminal) handled as SIGTERM
        is, unless ignored (as under nohup)."""
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread() or \
                    signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)  # before uvicorn raises the captured signals again

    def _drop_connections(self) -> None:
        """Aborts every connection still open, its unsent bytes discarded (one closing, its last
        bytes waiting for a client that reads nothing, too): uvicorn then marks its response
        disconnected and wakes a write waiting for the client, so the response's task ends as on a
        client that went away, without uvicorn's task cancellation and its ERROR lines."""
        num_dropped = 0
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
                num_dropped += 1
        if num_dropped:
            logger.info("dropped %d connection(s) still open after the drain", num_dropped)

    def _interrupt(self, cause: str = "drain deadline") -> None:
        count = self.served.interrupt_responses()
        if count:
            logger.warning("%s: %d running response(s) ended with 'server shutting down'", cause, count)


def _configure_access_log(is_on: bool) -> None:
    """The ``helios.access`` lines (one per request) on stderr, beside uvicorn's own log."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s access: %(message)s"))
    access_logger.handlers[:] = [handler]
    access_logger.propagate = False
    access_logger.setLevel(logging.INFO if is_on else logging.WARNING)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port`, not yet listening: bound before the model loads, a taken
    port or an unknown host fails at once, and until `serve` listens a connection is refused rather
    than left waiting in the backlog. `host` is an address or a name, resolved here (`_resolve`); an
    IPv6 literal may come in brackets, as in a URL (``[::1]``, the form the listening line prints)."""
    address = host[1:-1] if host.startswith("[") and host.endswith("]") and ":" in host else host
    shown = f"[{host}]" if _is_ipv6_literal(host) else host  # as URLs write it (not a name, nor "ADDRESS:PORT")
    try:
        family, sockaddr = _resolve(address)
    except (OSError, ValueError) as error:  # an unknown name (gaierror), or one no resolver takes (idna)
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ListenError(f"cannot listen on {shown}:{port}: {reason}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:  # an IPv4-mapped address (::ffff:127.0.0.1) is an IPv4 one: binds only dual
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if _is_ipv4_mapped(sockaddr[0]) else 1)
        _bind_exclusively(sock, (sockaddr[0], port, *sockaddr[2:]))
    except (OSError, OverflowError) as error:
        sock.close()
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ListenError(f"cannot listen on {shown}:{port}: {reason}") from None
    return sock


def _is_ipv6_literal(text: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, text.partition("%")[0])  # a scoped one's scope is not part of the address
    except (OSError, ValueError):
        return False
    return True


def _is_ipv4_mapped(address: str) -> bool:
    """Whether the IPv6 `address` is an IPv4-mapped one (``::ffff:127.0.0.1``): Linux binds it only
    on a socket that takes IPv4 too (IPV6_V6ONLY off; with it on, EINVAL), where it listens for that
    IPv4 address's connections, as the address says."""
    try:
        return ipaddress.IPv6Address(address.partition("%")[0]).ipv4_mapped is not None
    except ValueError:
        return False


def _resolve(address: str) -> tuple[int, tuple]:
    """The address family and socket address (port 0) that `address` (a literal or a name) binds:
    its first IPv4 address where it has one (as a name bound IPv4 before, and as uvicorn binds
    names), else its first IPv6 one (a name that resolves only to IPv6 addresses: it was bound as
    IPv4 and failed, the family having been read from a ':' in the text). A scoped IPv6 literal
    (``fe80::1%eth0``) keeps its scope."""
    infos = socket.getaddrinfo(address, 0, socket.AF_UNSPEC, socket.SOCK_STREAM)
    by_family = {}
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            by_family.setdefault(family, sockaddr)
    for family in (socket.AF_INET, socket.AF_INET6):
        if family in by_family:
            return family, by_family[family]
    raise OSError(errno.EAFNOSUPPORT, "the name has no IPv4 or IPv6 address")


def _bind_exclusively(sock: socket.socket, address: tuple) -> None:
    """Binds `sock` so that no other socket binds the port until `serve` listens (it sets
    SO_REUSEADDR just before). With SO_REUSEADDR on both, Linux lets a second socket bind a port
    that one not yet listening holds: a second `helios serve` started on the same port beside the
    first (both loading) loaded its whole model and failed only at `listen`. SO_REUSEADDR is taken
    only where the port is held, as after a restart, by connections of an earlier server waiting out
    TIME_WAIT, and dropped once bound."""
    try:
        sock.bind(address)
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)  # still refused where a server listens or a starting one holds the port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)


def uvicorn_config(app, options: ServeOptions, limits: ConnectionLimits) -> uvicorn.Config:
    """uvicorn's settings for `app`: uvloop, httptools with `limits` (the caller fits them to the
    process's descriptors), the drain of the module docstring."""
    return uvicorn.Config(
        app, loop="auto", http=protocol_factory(limits), lifespan="on", log_level=options.log_level,
        access_log=False, timeout_graceful_shutdown=options.drain_seconds + DROP_GRACE_SECONDS + BACKSTOP_SECONDS,
    )


def _announce(line: str) -> None:
    """The listening line on standard output; best effort, as the start's progress lines are: a
    reader that went away (`helios serve | true`, a closed terminal) never stops a loaded server
    (a broken pipe ended it with status 141). Standard output then points at /dev/null, so the line
    left in its buffer cannot fail a later flush (the one at exit), and standard error says why (a
    full disk under a redirected file is not hidden)."""
    try:
        print(line, file=sys.stdout, flush=True)
    except (OSError, ValueError) as error:  # a closed pipe or file
        with contextlib.suppress(OSError, ValueError, AttributeError):
            print(f"helios serve: standard output cannot be written ({error}); serving on: {line}", file=sys.stderr,
                  flush=True)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, sys.stdout.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a captured stream)
            pass


def serve(runtime: Runtime | EngineProcessRuntime, options: ServeOptions, owned_by: str = "",
          sock: socket.socket | None = None, ahead: FrontendAhead | None = None) -> int:
    """Serves `runtime` (a built, not started runtime) until a shutdown signal (see above), on `sock`
    (from `bind`; None: bound here to the options' address); `ahead`: the frontend's tokenizer and
    grammar compiler built while the model loaded (`helios.server.frontend_ahead`)."""
    served = ServedModel.from_runtime(
        runtime, queue_capacity=options.queue_capacity, frontend_workers=options.frontend_workers, owned_by=owned_by,
        send_timeout_s=options.send_timeout_s, served_names=options.served_names,
        image_limits=options.image_limits, stream_interval=options.stream_interval,
        liveness_timeout_s=options.liveness_timeout_s, ahead=ahead,
    )
    app = with_transport_send(create_app(served, options.max_body_nbytes, options.api_key))
    config = uvicorn_config(app, options, fit_to_fd_limit(options.connection_limits))
    _configure_access_log(options.access_log)
    sock = sock or bind(options.host, options.port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its connections' TIME_WAIT never blocks a restart
    sock.listen(BACKLOG)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    limits = served.admission.limits
    _announce(f"helios serve: {served.card.served_names[0]} on http://{shown}:{port} "
              f"(max active {limits.max_active}, queue {limits.queue_capacity}, "
              f"frontend workers {limits.frontend_workers})")
    server = HeliosServer(config, served, options.drain_seconds)
    mark("serve: listening")
    hold_freed_memory()
    freeze_startup_heap()
    server.run(sockets=[sock])
    if server.has_worker_died:
        raise WorkerDied(f"the model worker died ({server.worker_failure}); the server shut down (restart it)")
    return 0

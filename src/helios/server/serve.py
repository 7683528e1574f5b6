"""Running the HTTP server: uvicorn (uvloop when installed) on a socket bound here.

`serve(runtime, options, owned_by)` blocks until SIGTERM or SIGINT. Shutdown order: uvicorn stops
accepting, lets open connections finish for `drain_seconds` (the specification's five seconds) and
then drops the rest (their responses close and cancel their requests); only then does the app's
lifespan stop the model worker, which returns after its current round drained, so device resources
outlive every execution that uses them. After that uvicorn re-raises the signal, so the process
ends the way the signal says (status -15 / 143 for SIGTERM; SIGINT exits through `KeyboardInterrupt`).

The socket is bound before uvicorn starts so that port 0 works and the printed address is exact.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass

import uvicorn

from helios.errors import HeliosError
from helios.runtime.service import Runtime
from helios.server.app import create_app
from helios.server.service import ServedModel

DRAIN_SECONDS = 5


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 picks a free port
    queue_capacity: int = 256
    frontend_workers: int = 2
    drain_seconds: int = DRAIN_SECONDS
    log_level: str = "info"
    access_log: bool = False


class ListenError(HeliosError):
    """The server cannot listen on the requested address."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (IPv6 when `host` is an IPv6 literal)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as error:
        raise ListenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def serve(runtime: Runtime, options: ServeOptions, owned_by: str = "") -> int:
    """Serves `runtime` (a built, not started runtime) until a shutdown signal (see above)."""
    served = ServedModel.from_runtime(
        runtime, queue_capacity=options.queue_capacity, frontend_workers=options.frontend_workers, owned_by=owned_by
    )
    config = uvicorn.Config(
        create_app(served), loop="auto", lifespan="on", log_level=options.log_level,
        access_log=options.access_log, timeout_graceful_shutdown=options.drain_seconds,
    )
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    limits = served.admission.limits
    print(f"helios serve: {served.card.served_names[0]} on http://{shown}:{port} "
          f"(max active {limits.max_active}, queue {limits.queue_capacity}, "
          f"frontend workers {limits.frontend_workers})", file=sys.stdout, flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0

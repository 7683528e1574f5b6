"""A tiny core served from an engine process (as `helios serve` runs it), for tests that stop,
starve or kill that process: start it, talk to the app in-process, shrink the pipe's send buffer."""

from __future__ import annotations

import os
import socket

import httpx

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions
from helios.server.engine_process import CoreSource, start_engine_process
from helios.server.service import ServedModel

HANG_GUARD_S = 120.0  # a bounded wait that fails a test which would otherwise hang


def start_served(core, queue_capacity: int, **engine_options) -> ServedModel:
    """`core` (`support.server_core.tiny_core`) served from an engine process with one torch thread;
    `engine_options` go to `start_engine_process` (e.g. `liveness_timeout_s`)."""
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
    runtime = start_engine_process(source, opened.prepared, RuntimeOptions(queue_capacity=queue_capacity),
                                   torch_threads=1, **engine_options)
    served = ServedModel.from_runtime(runtime, queue_capacity=queue_capacity, frontend_workers=2)
    served.start()
    return served


def asgi_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=HANG_GUARD_S)


def shrink_send_buffer(connection) -> None:
    """Makes the serving end's pipe hold a few KiB, so a few requests fill it."""
    sock = socket.socket(fileno=os.dup(connection.fileno()))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    finally:
        sock.close()

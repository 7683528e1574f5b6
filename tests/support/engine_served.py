"""A tiny core served from an engine process (as `helios serve` runs it), for tests that stop,
starve or kill that process, or hold its model worker inside a round (`StepFault`): start it, talk
to the app in-process, shrink the pipe's send buffer."""

from __future__ import annotations

import functools
import multiprocessing
import os
import socket
import time

import httpx

from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions
from helios.server import engine_process
from helios.server.engine_process import CoreSource, start_engine_process
from helios.server.service import ServedModel

HANG_GUARD_S = 120.0  # a bounded wait that fails a test which would otherwise hang


class StepFault:
    """Shared with the engine process: while held, its model worker sleeps inside its round
    (`Engine.step`; without the interpreter lock, while its command loop runs on), and it sleeps
    `delay_s` (settable while it serves) in each round; its command loop beats every
    `beat_interval_s` (`engine_link.HEARTBEAT_INTERVAL_S`), so a short liveness timeout spans
    several beats. Plain shared values, no `multiprocessing.Event`: setting one of those blocks
    for ever once a process waiting on it was killed."""

    def __init__(self, beat_interval_s: float = 0.25):
        context = multiprocessing.get_context("spawn")
        self._is_held = context.RawValue("b", 0)
        self._delay_s = context.RawValue("d", 0.0)
        self.beat_interval_s = beat_interval_s

    def hold(self) -> None:
        self._is_held.value = 1

    def release(self) -> None:
        self._is_held.value = 0

    @property
    def delay_s(self) -> float:
        return self._delay_s.value

    @delay_s.setter
    def delay_s(self, value: float) -> None:
        self._delay_s.value = value

    def wrap(self, step):
        def faulty_step(engine) -> None:
            while self._is_held.value:
                time.sleep(0.005)
            if self._delay_s.value:
                time.sleep(self._delay_s.value)
            step(engine)
        return faulty_step


def _faulty_engine_main(fault: StepFault, *args) -> None:
    """The engine process's main (`engine_process._engine_main`) with `fault` on its worker's rounds."""
    from helios.runtime import engine_link
    from helios.runtime.engine import Engine

    Engine.step = fault.wrap(Engine.step)
    engine_link.HEARTBEAT_INTERVAL_S = fault.beat_interval_s
    engine_process._engine_main(*args)


def start_served(core, queue_capacity: int, fault: StepFault | None = None, frontend_workers: int = 2,
                 cpu_kernels: bool | None = None, **engine_options) -> ServedModel:
    """`core` (`support.server_core.tiny_core`) served from an engine process with one torch thread;
    `fault`: held or slowed rounds there; `cpu_kernels`: `LoadOptions.cpu_kernels` (False: the load skips
    building or loading the C++ kernels, seconds of CPU for a test that generates a few tokens);
    `engine_options` go to `start_engine_process` (e.g. `liveness_timeout_s`)."""
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
    main = engine_process._engine_main
    if fault is not None:  # the spawned process runs this main instead (pickled by reference)
        engine_process._engine_main = functools.partial(_faulty_engine_main, fault)
    try:
        options = RuntimeOptions(LoadOptions(cpu_kernels=cpu_kernels), queue_capacity=queue_capacity)
        runtime = start_engine_process(source, opened.prepared, options, torch_threads=1, **engine_options)
    finally:
        engine_process._engine_main = main
    served = ServedModel.from_runtime(runtime, queue_capacity=queue_capacity, frontend_workers=frontend_workers)
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

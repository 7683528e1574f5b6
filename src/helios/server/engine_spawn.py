"""Starting `helios serve`'s engine process ahead of its load order, from a module that imports
neither torch nor the serving stack.

A spawned Python spends seconds importing torch and the runtime before it can open a core, and the
serving process spends as long importing its own (torch, FastAPI, the frontend). So `helios serve`
starts the engine process first (`spawn_engine_process`), right after its flags are checked: the
process's imports run beside the serving process's, those its load would make after the order too
(`helios.server.engine_process.ahead_imports`: on the CPU, torch's program deserializer among
them), and on a CUDA device a thread starts the device's context and cuBLAS meanwhile
(`helios.server.engine_process.warm_device`). It then waits for its order (the core's source,
the runtime options, its torch threads) and loads. For a core file the order is sent at once
(`order_ahead`), as the command line it is made from (`ArgsOrder`: the engine process makes it
itself, as the serving process will): the load runs beside the serving process's imports. The
engine process opens and verifies the core itself, so nothing is loaded that the trusted keys do
not admit; the serving process still verifies it, and checks every flag, before it takes the process
over (`take`), so its errors come first and are its own. Otherwise (the embedded model, which a first
start prepares in the serving process) `helios.server.engine_process.start_engine_process` sends the
order once the serving process has verified the core and bound its socket. A start that fails before
the process is taken over or ordered (a refused option, a taken port, a signal) stops it with
`discard`, loading or not; a serving process that is gone stops it too (its orphan watch), and so
does the end of the pipe.

In the engine process the serving process decides when it stops: SIGINT, SIGTERM and SIGHUP are
ignored from the first line of its entry (each reaches a whole process group: Ctrl-C, a group's
kill, a closed terminal; the serving process drains its responses on them, which needs the engine
process serving until it orders its shutdown), and SIGUSR1 prints its threads' stacks
(`helios.cli.stack_dumps` does this in the serving process).
"""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable

from helios.server.start_trace import mark

ORPHAN_POLL_S = 0.2  # how often an engine process not yet serving checks that its serving process lives


@dataclass(frozen=True)
class EngineOrder:
    """What the engine process loads: `source` (`engine_process.CoreSource`), `options`
    (`helios.runtime.service.RuntimeOptions`) and its intra-op threads (None: torch's)."""

    source: object
    options: object
    torch_threads: int | None = None


@dataclass(frozen=True)
class ArgsOrder:
    """An order the engine process makes itself: `make(args)` returns its `EngineOrder` (a module-level
    function, pickled by reference: `helios.cli.serve_order.engine_order`)."""

    make: Callable
    args: object


class EngineSpawn:
    """An engine process started ahead of its order, and the serving process's end of its pipe."""

    def __init__(self, process, connection):
        self.process = process
        self.connection = connection
        self.ordered = False  # the process is its owner's to stop (`take`, `order`), not `discard`'s
        self.ordered_ahead = False

    def order(self, message: EngineOrder) -> None:
        """Sends the load order (once); `OSError` where the process is gone."""
        self.ordered = True  # sent or not, the process is the caller's to stop from here on
        self.connection.send(message)

    def order_ahead(self, message: ArgsOrder) -> None:
        """Sends the order before the serving process has checked it: the process loads, but `discard`
        still stops it until it is taken over (`take`). One whose pipe is closed is left to `take`'s owner
        (which reads how it ended)."""
        try:
            self.connection.send(message)
        except OSError:
            pass
        self.ordered_ahead = True

    def take(self) -> None:
        """The process ordered ahead is the caller's to stop from here on."""
        self.ordered = True

    def discard(self) -> None:
        """Stops the process unless it was ordered to load or taken over (idempotent)."""
        if self.ordered:
            return
        self.ordered = True
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.connection.close()


def spawn_engine_process(main: Callable | None = None, device: str | None = None) -> EngineSpawn:
    """Starts an engine process (`multiprocessing`, spawn) that imports the runtime and then waits for
    its order. `main(connection, source, options, torch_threads, serving)` runs the order, where
    `serving` is the event that ends the orphan watch; None: `helios.server.engine_process._engine_main`,
    looked up in the engine process (so the serving process need not import it first). `device`: the
    device the command line names, whose load's imports the process makes while it waits (None: none)."""
    context = multiprocessing.get_context("spawn")
    connection, child = context.Pipe()
    process = context.Process(target=_engine_entry, args=(child, os.getpid(), main, device), name="helios-engine",
                              daemon=False)
    process.start()
    child.close()
    return EngineSpawn(process, connection)


def _engine_entry(connection, parent_pid: int, main: Callable | None, device: str | None) -> None:
    """The engine process; `parent_pid`: the serving process's (it may be gone before this runs)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):  # a closed terminal hangs up the whole process group: the serving process drains
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    mark("engine: entered")
    if hasattr(signal, "SIGUSR1"):  # dumps this process's stacks too, as `helios serve`'s own do
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True, chain=False)
    serving = _exit_when_orphaned(parent_pid)
    if main is None:
        from helios.server.engine_process import _engine_main as main  # the imports the spawn runs ahead
        mark("engine: runtime imported")
    if device is not None:
        from helios.server.engine_process import ahead_imports, warm_device

        warm_device(device)
        for name in ahead_imports(device):
            importlib.import_module(name)
        mark("engine: load's imports made")
    try:
        order = connection.recv()
    except (EOFError, OSError):  # discarded: the start failed before the order
        return
    mark("engine: load order received")
    if isinstance(order, ArgsOrder):
        try:
            order = order.make(order.args)
        except BaseException as error:  # noqa: BLE001 - the serving process reports it (its own checks come first)
            from helios.server.engine_process import report_failure

            report_failure(connection, error)
            return
    main(connection, order.source, order.options, order.torch_threads, serving)


def _exit_when_orphaned(parent_pid: int) -> threading.Event:
    """Until the returned event is set (the ready record sent), ends this process when the serving
    process is gone: a load reads no pipe, and may take minutes the orphan would spend for nobody.
    Once serving, the end of the pipe stops it (`serve_link`)."""
    serving = threading.Event()

    def watch() -> None:
        while not serving.wait(ORPHAN_POLL_S):
            if os.getppid() != parent_pid:
                print("helios serve: the serving process is gone; the engine process stops loading",
                      file=sys.stderr, flush=True)
                os._exit(1)

    threading.Thread(target=watch, name="helios-engine-orphan-watch", daemon=True).start()
    return serving

"""The engine process's main (`helios.server.engine_process._engine_main`) on a thread of the test's
process over a real pipe: what the engine-grammar tests drive."""

from __future__ import annotations

import multiprocessing
import threading

from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions
from helios.server import engine_process
from helios.server.engine_process import CoreSource


def start_engine_main(core, monkeypatch) -> tuple[threading.Thread, object]:
    """Starts the engine process's main for the tiny `core` on a thread (its startup heap left
    alone); returns the thread and the serving side's pipe end."""
    monkeypatch.setattr(engine_process, "freeze_startup_heap", lambda: None)
    monkeypatch.setattr(engine_process, "hold_freed_memory", lambda: None)
    ours, theirs = multiprocessing.Pipe()
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
    options = RuntimeOptions(LoadOptions(cpu_kernels=False), queue_capacity=4)
    main = threading.Thread(target=engine_process._engine_main, args=(theirs, source, options, None, threading.Event()))
    main.start()
    return main, ours

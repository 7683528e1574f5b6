"""Modules a load will need, imported on a thread of their own while its main thread works.

A CUDA load's main thread needs torch._dynamo at its first custom op call (torch wraps every custom
op kernel to disable dynamo, importing it on the first call): on the device that import, mostly
file-system calls, took 4 s, and 10 s beside eight spawned compile workers' own imports
(bench/results/h200_session27_call1). `start` imports `LOAD_IMPORTS` on a thread while the main thread
builds the programs from their JSON, which imports nothing.

Two threads importing torch's circular packages at once can fail (Python's deadlock detection
between module locks: a `KeyError` or `_DeadlockError` in one of them, bench/results/h200_session27_call3),
so whatever may import them on another thread first calls `wait` (torch's program deserializer,
the dry run's first custom op). Process-wide, as imports are.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading

__all__ = ["LOAD_IMPORTS", "start", "wait"]

_LOG = logging.getLogger(__name__)
LOAD_IMPORTS = ("torch._dynamo",)
_LOCK = threading.Lock()
_PENDING: list[threading.Thread] = []


def start(names: tuple[str, ...] = LOAD_IMPORTS) -> None:
    """Imports `names` on a new thread (nothing when every one is imported already)."""
    missing = tuple(name for name in names if name not in sys.modules)
    if not missing:
        return
    thread = threading.Thread(target=_import, args=(missing,), name="helios-load-imports", daemon=True)
    with _LOCK:
        _PENDING.append(thread)
        thread.start()


def wait() -> None:
    """Returns once every import started ahead has ended (imported or failed: a failed one is then
    imported, and raises, where it is needed)."""
    with _LOCK:
        pending = list(_PENDING)
    for thread in pending:
        thread.join()
    with _LOCK:
        _PENDING[:] = [thread for thread in _PENDING if thread.is_alive()]


def _import(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - the load imports it itself, with its own error
            _LOG.debug("%s not imported ahead: %s", name, error)

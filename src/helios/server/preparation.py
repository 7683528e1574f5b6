"""CPU preparation of requests off the event loop: dedicated threads, slots, a time bound.

Preparation (template, tokenizing, grammar compile) runs in `PreparationPool`'s own threads, made
with a large stack (`STACK_NBYTES`): llguidance compiles grammars recursively in native code, and a
deep rule chain that fits the grammar size bound overflows a default 8 MiB thread stack, which
kills the process (a segfault, not an exception). With the size bounds of the request schema the
deepest grammar needs well under this stack.

`PreparationGate` decides when a request may start preparing: it waits for one of
`frontend_workers` preparation slots, and a request that compiles a grammar (structured output or
tools) first waits for one of `frontend_workers - 1` compile slots (at least one), so compiles can
never hold every preparation slot and plain requests keep being prepared. A preparation that runs
longer than `timeout_s` fails its request with `PreparationTimeout` (HTTP 400); the thread cannot
be stopped from outside, so its slots stay held until it ends (a flood of slow grammars waits for
slots rather than piling up threads); so do those of a preparation whose request was cancelled
(its client went away) while it ran. The chat-template render stops itself: its CPU-time bound
(`helios.frontend.preparation.template.SERVING_BOUNDS`) ends a runaway render after a few seconds
of CPU time, whether or not its request timed out first.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from typing import Any, Callable

from helios.errors import RequestError

STACK_NBYTES = 256 * 1024 * 1024  # reserved address space; only the pages a compile touches are used
DEFAULT_PREPARATION_TIMEOUT_S = 10.0


class PreparationTimeout(RequestError):
    """Preparing the request (in practice: compiling its grammar) took longer than allowed."""


class PreparationPool:
    """`num_threads` daemon threads with `stack_nbytes` stacks running submitted calls in order."""

    def __init__(self, num_threads: int, stack_nbytes: int = STACK_NBYTES):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        previous = threading.stack_size()
        threading.stack_size(stack_nbytes)
        try:
            for index in range(num_threads):
                threading.Thread(target=_work, args=(self._jobs,), name=f"helios-prepare-{index}", daemon=True).start()
        finally:
            threading.stack_size(previous)
        # The threads end once the pool is closed or collected (they hold the queue, not the pool).
        self._finalizer = weakref.finalize(self, _stop, self._jobs, num_threads)

    def submit(self, call: Callable[..., Any], *args) -> asyncio.Future:
        """A future of the running loop that `call(*args)`'s result or exception completes."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, call, args))
        return future

    def close(self) -> None:
        """Lets the threads end once the calls already submitted ran (idempotent)."""
        self._finalizer()


def _stop(jobs: queue.SimpleQueue, num_threads: int) -> None:
    for _ in range(num_threads):
        jobs.put(None)


def _work(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        loop, future, call, args = job
        try:
            outcome, is_error = call(*args), False
        except StopIteration as error:
            # A future refuses StopIteration (asyncio raises TypeError in `_settle`): the request waited
            # for its time bound, was blamed as a slow grammar, and its slots were never freed.
            outcome, is_error = RuntimeError(f"preparation raised StopIteration: {error}"), True
            outcome.__cause__ = error
        except BaseException as error:  # noqa: BLE001 - handed to the waiting request
            outcome, is_error = error, True
        try:
            loop.call_soon_threadsafe(_settle, future, outcome, is_error)
        except RuntimeError:  # the loop is closed: nobody waits for this result
            pass


def _settle(future: asyncio.Future, outcome: Any, is_error: bool) -> None:
    if future.done():
        return
    if is_error:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class PreparationGate:
    """Preparation and compile slots (event-loop bound) and the time bound; see the module docstring."""

    def __init__(self, pool: PreparationPool, frontend_workers: int, timeout_s: float = DEFAULT_PREPARATION_TIMEOUT_S):
        self._pool = pool
        self._num_slots = frontend_workers
        self._num_compile_slots = max(1, frontend_workers - 1)
        self._timeout_s = timeout_s
        self._slots: asyncio.Semaphore | None = None
        self._compile_slots: asyncio.Semaphore | None = None

    def close(self) -> None:
        self._pool.close()

    async def run(self, call: Callable[..., Any], *args, compiles: bool) -> Any:
        """`call(*args)` in the pool once slots are free; `PreparationTimeout` past the bound."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._num_slots)
            self._compile_slots = asyncio.Semaphore(self._num_compile_slots)
        held = [self._compile_slots] if compiles else []
        held.append(self._slots)
        acquired, future = [], None
        try:
            for semaphore in held:
                await semaphore.acquire()
                acquired.append(semaphore)
            future = self._pool.submit(call, *args)
            done, _ = await asyncio.wait({future}, timeout=self._timeout_s)
        except BaseException:  # cancelled (the client went away): a submitted call still runs, holding its slots
            if future is None:
                _release(acquired)
            else:
                future.add_done_callback(lambda late: _release_late(acquired, late))
            raise
        if not done:
            future.add_done_callback(lambda late: _release_late(acquired, late))
            raise PreparationTimeout(
                f"preparing the request took more than {self._timeout_s:g} s (is its grammar or schema "
                "too complex?); simplify it")
        _release(acquired)
        return future.result()


def _release_late(semaphores: list, future: asyncio.Future) -> None:
    """Frees the slots of a preparation that ended after its request timed out or was cancelled; its
    outcome has no reader left (retrieving it keeps asyncio from logging "exception was never retrieved")."""
    _release(semaphores)
    if not future.cancelled():
        future.exception()


def _release(semaphores: list) -> None:
    for semaphore in semaphores:
        semaphore.release()

"""The serving process's commands to an engine process, without ever waiting on its pipe.

`EngineLink` (`helios.runtime.engine_link`) writes each command (`submit`, `cancel`,
`stop_matched`) to the engine process's pipe on the calling thread. A pipe write blocks while the
pipe is full: an engine process that stopped reading (stopped by SIGSTOP or a debugger, or busy in
its main thread, compiling a request's grammar) fills it after a few hundred kilobytes of commands,
a few long prompts. The callers are the event loop (submissions, a client's cancel) and the output
workers (stops), so one full pipe froze every connection, `/health` and `/metrics` included.

`QueuedCommands` stands for the link's commands in `ServedModel`: a command is written on the
calling thread only where that cannot block (the pipe drained: the engine process has read every
byte written so far, `unread_bytes` 0; nothing queued or being written; a small message), else
queued for a sender thread, which writes the queue in order. Commands reach the engine process in
the order they were made (submit before its cancel), whichever way each one went. The queue is
bounded by the admitted requests (a submission, a cancel and a stop each at most).

With an engine on a thread of this process (`Runtime`: its commands append under a lock and never
block) the engine's own methods are used (`engine_commands`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

from helios.runtime.engine import EngineRequest
from helios.runtime.engine_link import DuplicateRequestId, unread_bytes
from helios.runtime.outlet import StepBatch
from helios.runtime.records.events import FinishEvent, FinishReason

logger = logging.getLogger("uvicorn.error")

DIRECT_NBYTES = 64 * 1024  # a command estimated at most this large may be written on the caller's thread
ID_NBYTES = 5  # a prompt token id's pickled size, at most
KEY_NBYTES = 20  # a (prompt index, image key) pair of `RequestSpec.token_keys`, pickled, at most
CLOSE_TIMEOUT_S = 30.0


class QueuedCommands:
    """`submit`, `cancel` and `stop_matched` of an engine link (see the module docstring); any thread."""

    def __init__(self, link, connection):
        """`link`: the `EngineLink`; `connection`: the pipe end it writes (for its unread bytes)."""
        self._link = link
        self._connection = connection
        self._wake = threading.Condition()
        self._queue: deque[tuple[Callable, tuple]] = deque()
        self._is_writing = False
        self._is_closing = False
        self._is_stopped = False  # the sender thread ended (closed): commands go straight to the link
        self._thread = threading.Thread(target=self._run, name="helios-engine-commands", daemon=True)
        self._thread.start()

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def submit(self, request: EngineRequest) -> None:
        spec = request.spec
        source = getattr(request.grammar, "source", None) if request.grammar is not None else None
        nbytes = ID_NBYTES * (len(spec.prompt_ids) + sum(map(len, spec.stop_token_sequences)))
        nbytes += len(source or "") + sum(map(len, spec.stop_strings)) + 16 * len(spec.logit_bias)
        nbytes += KEY_NBYTES * len(spec.token_keys) + image_nbytes(spec.images)
        self._command(self._link.submit, (request,), nbytes <= DIRECT_NBYTES)

    def cancel(self, request_id: str) -> None:
        self._command(self._link.cancel, (request_id,), True)

    def stop_matched(self, request_id: str, num_output_tokens: int) -> None:
        self._command(self._link.stop_matched, (request_id, num_output_tokens), True)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Writes what is queued, then stops the sender thread (waits at most `timeout`)."""
        with self._wake:
            self._is_closing = True
            self._wake.notify_all()
        self._thread.join(timeout)

    def _command(self, call: Callable, args: tuple, is_small: bool) -> None:
        with self._wake:
            if self._is_stopped:  # closed: the link ends or drops what it can no longer send
                is_direct = True
            else:
                is_direct = (is_small and not self._queue and not self._is_writing
                             and unread_bytes(self._connection) == 0)
            if not is_direct:
                self._queue.append((call, args))
                self._wake.notify_all()
                return
            self._is_writing = True
        try:
            call(*args)
        finally:
            with self._wake:
                self._is_writing = False
                if self._queue:
                    self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._wake:
                while (not self._queue or self._is_writing) and not (self._is_closing and not self._queue):
                    self._wake.wait()
                if not self._queue:
                    self._is_stopped = True
                    return
                call, args = self._queue.popleft()
                self._is_writing = True
            try:
                call(*args)
            except Exception as error:  # noqa: BLE001 - a command refused by the link fails its request alone
                self._refused(call, args, error)
            finally:
                with self._wake:
                    self._is_writing = False

    def _refused(self, call: Callable, args: tuple, error: Exception) -> None:
        """A queued command the link raised on (on the caller's thread it would have raised there):
        logged, and a refused submission ends its request with ERROR, so that its response ends;
        not a duplicate id's (`DuplicateRequestId`): that end would reach the running request of its id."""
        logger.error("an engine command failed: %s: %s", type(error).__name__, error)
        if call == self._link.submit and self._link.sink is not None and not isinstance(error, DuplicateRequestId):
            spec = args[0].spec
            message = f"request failed: {type(error).__name__}: {error}"
            self._link.sink(StepBatch((FinishEvent(spec.request_id, FinishReason.ERROR, len(spec.prompt_ids), 0, 0,
                                                   message),)))


def image_nbytes(images) -> int:
    """The bytes of a request's image arrays (`RequestImages`; None: text only) at their padded
    extent: pickling trims each vision tensor's trailing zero rows (`RequestImages.__reduce__`) but
    reads those rows to find them, so its work grows with the padded size (a 1-megapixel image
    pickles about 23 MB, an 8x8 one still scans its capacity's zeros)."""
    if images is None:
        return 0
    arrays = [array for tensors in images.vision_inputs for array in tensors.values()]
    arrays += [*images.feature_tokens, *images.token_outputs.values()]
    return sum(getattr(array, "nbytes", 0) for array in arrays)


def engine_commands(runtime):
    """What `ServedModel` sends `submit`, `cancel` and `stop_matched` to: `QueuedCommands` over an
    engine process's link, the engine itself on a thread of this process."""
    connection = getattr(runtime, "connection", None)
    if connection is None:
        return runtime.engine
    return QueuedCommands(runtime.engine, connection)

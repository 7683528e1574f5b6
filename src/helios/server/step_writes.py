"""A stream's per-step writes: presenting arrived items as SSE bytes (`present`) and writing them
in the event loop's delivery while the response's task waits (`DirectWrites`, with `Handoff` for
what such a write leaves to the task). See `helios.server.responses` for the stream around them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from helios.errors import ExecutionError, HeliosError
from helios.frontend.responses.output import OutputFinal, OutputStep
from helios.frontend.responses.presentation import StreamPresenter, sse_error
from helios.frontend.responses.step_run import StepRun, runs_of
from helios.server.bridge import Item, ResponseBridge
from helios.server.chunk_writer import ChunkWriter


def present(presenter: StreamPresenter, items: list[Item]) -> tuple[bytes, bool]:
    """SSE bytes of `items` and whether the stream is over. One plain step (the common delivery:
    one id, text or chat content, no log-probabilities) is one formatting operation from the
    stream's byte template (`StreamPresenter.sse_plain_step`); consecutive steps (a reader that
    fell behind) are presented as one run (`helios.frontend.responses.step_run`). A presentation
    failure ends the stream with an execution error event (the bridge's close then cancels the
    request)."""
    if len(items) == 1 and type(items[0]) is OutputStep:  # one step: the common case, one format
        try:
            chunk = presenter.sse_plain_step(items[0])
        except Exception:  # noqa: BLE001 - the general path below decides what the failure becomes
            chunk = None
        if chunk is not None:
            return chunk, False
    parts = []
    try:
        for item in runs_of(items):
            if isinstance(item, StepRun):
                parts.append(presenter.sse_run(item))
            elif isinstance(item, OutputFinal):
                parts.append(presenter.sse_finish(item))
                return b"".join(parts), True
            else:
                parts.append(sse_error(item.error))
                return b"".join(parts), True
    except Exception as error:  # noqa: BLE001 - the stream still ends with one terminal event
        failure = error if isinstance(error, HeliosError) else ExecutionError(f"presentation failed: {error}")
        parts.append(sse_error(failure))
        return b"".join(parts), True
    return b"".join(parts), False


@dataclass
class Handoff:
    """What a direct write left to the response's task: a write that must wait (`write`, suspended
    on `waits_on`), a write that failed (`error`), or the stream's last message (`last`: a
    presentation failure's error event)."""

    write: object = None  # the send's coroutine, started outside any task
    waits_on: object = None  # what it yielded: a future, or None for a bare yield
    error: Exception | None = None
    last: bytes | None = None

    async def finish(self) -> None:
        """Runs the write to its end in the calling task, as a task would have: awaiting what it
        waits on and passing the outcome (a result, or an error such as the task's cancellation by
        its send deadline or by a disconnect) back into it."""
        if self.error is not None:
            raise self.error
        write, waits_on = self.write, self.waits_on
        self.write = None
        while True:
            try:
                if waits_on is None:
                    await asyncio.sleep(0)
                else:
                    waits_on._asyncio_future_blocking = False  # as a task does with what it is given
                    await waits_on
            except BaseException as error:  # noqa: BLE001 - the write decides what it becomes
                try:
                    waits_on = write.throw(error)
                except StopIteration:
                    return
                continue
            try:
                waits_on = write.send(None)
            except StopIteration:
                return


class DirectWrites:
    """A stream's per-step writes made in the event loop's delivery while its task waits for items
    (`ResponseBridge.read_directly`), which saves the task's wakeup per stream per step. The write
    (the server's own send, under the send deadline) runs synchronously as far as it goes: it
    completes at once unless the connection is paused for flow control. One that must wait, one that
    fails, and a presentation that ends the stream are handed to the task (`take_handoff`, after the
    bridge wakes it), which finishes them in order before anything that arrived later."""

    def __init__(self, presenter: StreamPresenter, write, bridge: ResponseBridge, raw: ChunkWriter | None = None):
        """`raw`: writes a chunk at once when it can (`helios.server.chunk_writer`), else `write`."""
        self._presenter = presenter
        self._write = write
        self._raw = raw
        self._bridge = bridge
        self._handoff: Handoff | None = None

    def __call__(self, items: list[Item]) -> bool:
        if self._handoff is not None:
            return False
        chunk, is_done = present(self._presenter, items)
        if is_done:
            self._handoff = Handoff(last=chunk)
        elif self._raw is not None and self._raw(chunk):
            return True
        else:
            write = self._write({"type": "http.response.body", "body": chunk, "more_body": True})
            try:
                waits_on = write.send(None)
            except StopIteration:
                return True
            except Exception as error:  # noqa: BLE001 - raised in the task, as its own write would
                self._handoff = Handoff(error=error)
            else:
                self._handoff = Handoff(write=write, waits_on=waits_on)
        self._bridge.wake()
        return True

    def take_handoff(self) -> Handoff | None:
        handoff, self._handoff = self._handoff, None
        return handoff

    def close(self) -> None:
        """Closes a write handed off but never finished (the task ended first)."""
        if self._handoff is not None and self._handoff.write is not None:
            self._handoff.write.close()
        self._handoff = None

"""`QueuedCommands`' choice of thread for a submission: a command estimated small is written on the
calling thread (the event loop), a large one by the sender thread, so that pickling it never holds
the loop. No engine process: the link is a recorder over a real, drained pipe."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np

from helios.runtime.engine import EngineRequest
from helios.runtime.execution.images import RequestImages
from helios.runtime.records.request import RequestSpec
from helios.server.engine_commands import DIRECT_NBYTES, QueuedCommands


class _Recorder:
    """An engine link that records the thread each submission was written on."""

    sink = None

    def __init__(self):
        self.threads: list[str] = []

    def submit(self, request: EngineRequest) -> None:
        self.threads.append(threading.current_thread().name)


def _written_on(spec: RequestSpec) -> str:
    ours, theirs = multiprocessing.Pipe()
    try:
        link = _Recorder()
        commands = QueuedCommands(link, ours)  # nothing written: the pipe is drained
        commands.submit(EngineRequest(spec))
        commands.close(timeout=5.0)
        assert len(link.threads) == 1
        return link.threads[0]
    finally:
        ours.close()
        theirs.close()


def test_a_request_with_a_large_image_is_written_off_the_calling_thread():
    """The size estimate counted prompt ids, stops, grammar and bias, never the images: a request
    with a 1-megapixel image (about 23 MB of vision inputs, pickled on the writing thread) of a short
    prompt was written on the event loop."""
    rows = 2 * DIRECT_NBYTES // (1176 * 4)  # a vision tensor of twice the direct bound
    pixels = np.ones((rows, 1176), dtype=np.float32)
    images = RequestImages(("0" * 64,), (rows,), ({"pixel_values": pixels},), (np.arange(1, 5),),
                           {"rotary_offsets": np.zeros((8, 3), dtype=np.int64)})
    spec = RequestSpec("a", tuple(range(8)), 4)
    assert _written_on(spec) == threading.current_thread().name  # the text alone: small
    with_image = RequestSpec("b", tuple(range(8)), 4, token_keys=images.token_keys(), images=images)
    assert _written_on(with_image) == "helios-engine-commands"

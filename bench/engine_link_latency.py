"""The engine-process link alone: how late a round's tokens reach the serving process's sink, and
how much the link slows the model worker, with a stand-in engine whose worker thread emits one token
event per step (`--pack-ms` of Python work holding the interpreter lock, then `--wait-ms` waiting
with it released, as a CUDA worker packs and then waits for the device).

    .venv/bin/python bench/engine_link_latency.py [--steps 400] [--pack-ms 1.0] [--wait-ms 3.0]
        [--streams 1]

Not a test; CPU only. Prints medians of delivery latency (emission in the engine process to the
sink in this process, both on the monotonic clock) and the worker's step time against the step it
was asked for (pack + wait).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time

from helios.runtime.engine_link import EngineLink, serve_link
from helios.runtime.engine import EngineRequest
from helios.runtime.outlet import StepBatch
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.stats import WorkerStats


class StandInEngine:
    """The `Engine` interface `serve_link` uses; one request at a time, `streams` lanes."""

    def __init__(self, pack_s: float, wait_s: float, streams: int):
        self.pack_s, self.wait_s, self.streams = pack_s, wait_s, streams
        self.stats = WorkerStats()
        self.is_healthy, self.failure, self.sink = True, None, None
        self._requests: list[RequestSpec] = []
        self._wake = threading.Condition()
        self._running = True

    def connect(self, sink) -> None:
        self.sink = sink

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, request: EngineRequest) -> None:
        with self._wake:
            self._requests.append(request.spec)
            self._wake.notify()

    def refresh_gauges(self) -> None:
        pass

    def shutdown(self) -> None:
        with self._wake:
            self._running = False
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while self._running and not self._requests:
                    self._wake.wait()
                if not self._running:
                    return
                spec = self._requests.pop(0)
            steps = []
            for _ in range(spec.max_output_tokens):
                started = time.perf_counter()
                while time.perf_counter() - started < self.pack_s:
                    pass  # packing: Python holding the interpreter lock
                time.sleep(self.wait_s)  # the device's step: the lock released
                now = time.monotonic_ns()
                self.sink(StepBatch(tuple(TokenEvent(f"{spec.request_id}-{k}", (7,), now)
                                          for k in range(self.streams))))
                steps.append(time.perf_counter() - started)
            self.sink(StepBatch((FinishEvent(spec.request_id, FinishReason.LENGTH, 1, len(steps), 0,
                                             repr(statistics.median(steps))),)))


def _engine_main(connection, pack_s: float, wait_s: float, streams: int) -> None:
    serve_link(connection, StandInEngine(pack_s, wait_s, streams), lambda source: None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pack-ms", type=float, default=1.0)
    parser.add_argument("--wait-ms", type=float, default=3.0)
    parser.add_argument("--streams", type=int, default=1)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_engine_main, args=(theirs, args.pack_ms / 1e3, args.wait_ms / 1e3,
                                                         args.streams), daemon=True)
    process.start()
    theirs.close()
    link = EngineLink(ours, process)
    latencies: list[float] = []
    finished: list[str] = []
    done = threading.Event()

    def sink(batch: StepBatch) -> None:
        now = time.monotonic_ns()
        for event in batch.events:
            if type(event) is TokenEvent:
                latencies.append((now - event.observed_ns) / 1e6)
            elif type(event) is FinishEvent:
                finished.append(event.message)
                done.set()

    link.connect(sink)
    link.start()
    link.submit(EngineRequest(RequestSpec("hop", (1,), args.steps)))
    done.wait(600)
    link.shutdown()
    step_ms = float(finished[0]) * 1e3
    asked = args.pack_ms + args.wait_ms
    print(f"{args.streams} stream(s), {args.steps} steps of {args.pack_ms} ms packing + {args.wait_ms} ms waiting")
    print(f"delivery latency median {statistics.median(latencies):.3f} ms, "
          f"p90 {statistics.quantiles(latencies, n=10)[-1]:.3f} ms; "
          f"worker step median {step_ms:.3f} ms ({step_ms - asked:+.3f} ms over {asked:.1f})")


if __name__ == "__main__":
    main()

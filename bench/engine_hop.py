"""The engine-process hop at one stream: per-token time of one greedy request through an engine on
a thread of this process against the same engine in an engine process (`EngineLink`), both read at
the sink the server connects (no HTTP), interleaved round by round.

    .venv/bin/python bench/engine_hop.py [--tokens 64] [--rounds 10] [--streams 1]
        [--core MODEL.core --accept NS --trust KEY.pub | --checkpoint DIR]

Not a test. Without --core a checkpoint is prepared as `bench/server_overhead.py` does. Per stream:
submission to first token, per-token = (last token - first token) / (n - 1), last token to the
finish's arrival, submission to finish, all at the sink; medians over all streams of all rounds. On
a shared CPU the two sides' per-token times move with other load by more than the hop costs:
`bench/engine_link_latency.py` measures the hop alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_overhead import NAMESPACE, PROMPT, CoreRef, prepare  # noqa: E402


class Side:
    """A started engine (thread) or link (process) whose sink records token arrival times."""

    def __init__(self, engine):
        self.engine = engine
        self.times: dict[str, list[float]] = {}
        self.done = threading.Semaphore(0)
        engine.connect(self._sink)
        engine.start()

    def _sink(self, batch) -> None:
        from helios.runtime.records.events import TokenEvent

        now = time.perf_counter()
        for event in batch.events:
            if type(event) is TokenEvent:
                self.times[event.request_id].extend([now] * len(event.token_ids))
            else:
                self.times[event.request_id].append(now)  # the finish's arrival, last
                self.done.release()

    def round(self, name: str, streams: int, tokens: int) -> list[tuple[float, float, float, float]]:
        """Per stream: (submission to first token, per-token, last token to finish, submission to
        finish), in seconds."""
        from helios.runtime.engine import EngineRequest
        from helios.runtime.records.request import RequestSpec

        ids = [f"{name}-{k}" for k in range(streams)]
        started = time.perf_counter()
        for request_id in ids:
            self.times[request_id] = []
            self.engine.submit(EngineRequest(RequestSpec(request_id, PROMPT, tokens, frozenset())))
        for _ in ids:
            self.done.acquire()
        return [(t[0] - started, (t[-2] - t[0]) / (len(t) - 2), t[-1] - t[-2], t[-1] - started)
                for t in (self.times.pop(r) for r in ids) if len(t) > 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--core")
    parser.add_argument("--accept", default=NAMESPACE)
    parser.add_argument("--trust")
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    import torch

    from helios.core.reader import open_core
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.engine_process import CoreSource, start_engine_process

    torch.set_num_threads(args.torch_threads)
    with tempfile.TemporaryDirectory() as scratch:
        core = (CoreRef(Path(args.core), args.accept, Path(args.trust)) if args.core
                else prepare(Path(scratch), args.checkpoint))
        opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
        local = build_runtime(opened, RuntimeOptions())
        source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
        remote = start_engine_process(source, opened.prepared, RuntimeOptions(), args.torch_threads)
        sides = {"thread": Side(local.engine), "process": Side(remote.engine)}
        samples: dict[str, list[float]] = {name: [] for name in sides}
        try:
            for k in range(args.rounds + 1):  # the first round warms both up
                for name, side in sides.items():
                    per_token = side.round(f"{name}{k}", args.streams, args.tokens)
                    if k:
                        samples[name].extend(per_token)
        finally:
            remote.close()
            local.close()
    print(f"{args.streams} stream(s), {args.tokens} tokens, {args.rounds} rounds; medians at the sink (ms)")
    print("| measure | thread | process | process - thread | process / thread |")
    print("|---|---|---|---|---|")
    for k, label in enumerate(("first token", "per token", "last token to finish", "request")):
        ours, theirs = (statistics.median(s[k] for s in samples[n]) * 1e3 for n in ("thread", "process"))
        ratio = f"{theirs / ours:.2f}x" if ours else "-"
        print(f"| {label} | {ours:.3f} | {theirs:.3f} | {theirs - ours:+.3f} | {ratio} |")


if __name__ == "__main__":
    main()

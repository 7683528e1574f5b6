"""Why the engine process's model worker costs more CPU per token than the in-process engine's:
the model worker's CPU per token (its thread's, from /proc) in-process and in an engine process
with no serving process behind its link (the batches are dropped on the link's reader thread),
then in-process again beside co-runners on the other cores (a spinning process; a process that
writes 300-byte messages to a loopback socket pair 8,000 times a second, many wakeups and little
CPU, as a serving process does). Rounds alternate, so load from other work hits every mode alike.

    .venv/bin/python bench/worker_colocation.py --core MODEL.core --trust KEY.pub [--accept NS]
        [--streams 64] [--tokens 64] [--rounds 4] [--cycles 3]

Not a test. Prints one line per measurement: CPU us per token and involuntary context switches per
step of the model worker (the busiest thread of its process during the rounds).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from server_overhead import PROMPT, CoreRef, InProcess

SPIN = "x = 0\nwhile True:\n    x += 1\n"
PING = """import socket, threading, time
a, b = socket.socketpair()
threading.Thread(target=lambda: [b.recv(4096) for _ in iter(int, 1)], daemon=True).start()
due = time.monotonic()
while True:
    a.send(b"x" * 300)
    due += 1 / 8000
    time.sleep(max(0.0, due - time.monotonic()))
"""


def thread_times(pid: int) -> dict[str, tuple[float, int]]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":\t") for line in (task / "status").read_text().splitlines() if ":\t" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[task.name] = ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                          int(status["nonvoluntary_ctxt_switches"]))
    return out


def measure(label: str, pid: int, run_round, rounds: int, streams: int, tokens: int) -> None:
    before = thread_times(pid)
    for _ in range(rounds):
        run_round()
    after = thread_times(pid)
    cpu, switches = max((after[k][0] - before.get(k, (0.0, 0))[0], after[k][1] - before.get(k, (0.0, 0))[1])
                        for k in after)
    print(f"{label}: model worker {cpu / (rounds * streams * tokens) * 1e6:.1f} us CPU/token, "
          f"{switches / (rounds * tokens):.2f} involuntary switches/step", flush=True)


class LinkedEngine:
    """An engine process (as `helios serve` starts it) whose batches are dropped on arrival."""

    def __init__(self, core: CoreRef, tokens: int):
        from helios.core.reader import open_core
        from helios.runtime.records.events import FinishEvent
        from helios.runtime.service import RuntimeOptions
        from helios.server.engine_process import CoreSource, start_engine_process

        opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
        source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
        self.runtime = start_engine_process(source, opened.prepared, RuntimeOptions(), 1)
        self.link, self.tokens, self._count, self.eos = self.runtime.engine, tokens, 0, frozenset()
        self._done = threading.Semaphore(0)
        self.link.connect(lambda batch: [self._done.release() for e in batch.events if type(e) is FinishEvent])
        self.link.start()

    @property
    def pid(self) -> int:
        return self.link._process.pid

    def round(self, level: int) -> None:
        from helios.runtime.engine import EngineRequest
        from helios.runtime.records.request import RequestSpec

        for _ in range(level):
            self._count += 1
            self.link.submit(EngineRequest(RequestSpec(f"link-{self._count}", PROMPT, self.tokens, self.eos)))
        for _ in range(level):
            self._done.acquire()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", required=True)
    parser.add_argument("--trust", required=True)
    parser.add_argument("--accept", default="bench.helios/server")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    core = CoreRef(Path(args.core), args.accept, Path(args.trust))
    in_process, linked = InProcess(core, args.tokens), LinkedEngine(core, args.tokens)
    linked.eos = frozenset(in_process.eos)  # the same requests on both sides
    in_process.round(args.streams, None)
    linked.round(args.streams)
    shape = (args.rounds, args.streams, args.tokens)
    try:
        for _ in range(args.cycles):
            measure("in-process", os.getpid(), lambda: in_process.round(args.streams, None), *shape)
            measure("engine process, no serving process", linked.pid, lambda: linked.round(args.streams), *shape)
            for name, code in (("a spinning process", SPIN), ("loopback writes, 8k/s", PING)):
                other = subprocess.Popen([sys.executable, "-c", code])
                time.sleep(0.3)
                measure(f"in-process beside {name}", os.getpid(), lambda: in_process.round(args.streams, None), *shape)
                other.kill()
                other.wait()
    finally:
        in_process.close()
        linked.runtime.close()


if __name__ == "__main__":
    main()

"""The in-process model worker's CPU and page faults per step with glibc malloc's own (moving)
thresholds and with them held (`RuntimeOptions.hold_freed_memory`, `helios.runtime.host_heap`, every
engine's default), each in a fresh process, alternating.

    .venv/bin/python bench/worker_page_faults.py --core MODEL.core --trust KEY.pub [--accept NS]
        [--pairs 3] [--streams 64] [--tokens 64] [--rounds 6]

Not a test. Each child builds the runtime, runs one warm-up round and `--rounds` rounds of
`--streams` greedy requests of `--tokens` tokens (`bench/server_overhead.py`'s in-process side),
and reports the model worker thread's CPU per token, its kernel part and its minor page faults
per step (from /proc). `bench/server_overhead.py` prepares a core when none is at hand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def thread_counters() -> dict[str, tuple[str, int, int, int]]:
    """Per thread of this process: (name, user ticks, kernel ticks, minor faults)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        out[tid] = (name, int(fields[11]), int(fields[12]), int(fields[7]))
    return out


def child(args) -> None:
    import torch

    import server_overhead
    from server_overhead import NAMESPACE, CoreRef, InProcess

    server_overhead.IN_PROCESS_HOLDS_FREED_MEMORY = args.mode == "held"

    torch.set_num_threads(1)
    side = InProcess(CoreRef(Path(args.core), args.accept or NAMESPACE, Path(args.trust)), args.tokens)
    side.round(args.streams, None)
    before, started = thread_counters(), time.perf_counter()
    for _ in range(args.rounds):
        side.round(args.streams, None)
    elapsed, after = time.perf_counter() - started, thread_counters()
    side.close()
    tick, tokens, steps = os.sysconf("SC_CLK_TCK"), args.rounds * args.streams * args.tokens, args.rounds * args.tokens
    busiest = max(after, key=lambda t: sum(after[t][1:3]) - sum(before.get(t, ("", 0, 0, 0))[1:3]))
    name, user, kernel, faults = after[busiest]
    _, user0, kernel0, faults0 = before.get(busiest, (name, 0, 0, 0))
    print(json.dumps({"thread": name, "us_per_token": (user - user0 + kernel - kernel0) / tick / tokens * 1e6,
                      "kernel_us_per_token": (kernel - kernel0) / tick / tokens * 1e6,
                      "faults_per_step": (faults - faults0) / steps, "elapsed_s": elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", required=True)
    parser.add_argument("--trust", required=True)
    parser.add_argument("--accept")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--mode", choices=("glibc", "held"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is not None:
        child(args)
        return
    print("| pair | malloc thresholds | model worker CPU us/token | of which kernel | minor page faults/step | load |")
    print("|---|---|---|---|---|---|")
    for pair in range(args.pairs):
        for mode in (("glibc", "held") if pair % 2 == 0 else ("held", "glibc")):
            command = [sys.executable, __file__, *sys.argv[1:], "--mode", mode]
            result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            print(f"| {pair + 1} | {mode} | {result['us_per_token']:.1f} | {result['kernel_us_per_token']:.1f} "
                  f"| {result['faults_per_step']:.1f} | {os.getloadavg()[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()

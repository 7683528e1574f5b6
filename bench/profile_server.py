"""Where the serving path's CPU goes: per-thread CPU per token of `helios serve` (the serving process
and its engine process) under streamed load, and, with py-spy installed (the `dev` extra), the
functions each thread spends its samples in.

    .venv/bin/python bench/profile_server.py --core MODEL.core --trust KEY.pub [--accept NS]
        [--streams 64] [--rounds 6] [--tokens 64] [--spy gil|wall|off] [--rate 300] [--top 25]
        [--client-gather-ms 0.5] [--server-flag=--FLAG ...]

Not a test. The server runs the core with `--torch-threads 1`; the client is the benchmarks' raw
SSE client in a process of its own (`bench/sse_client.py`). After one warm-up round, `--rounds`
rounds of `--streams` concurrent greedy completions of `--tokens` tokens run while py-spy samples
both processes (`--spy gil`: only threads holding the interpreter lock, so a thread's samples are
its Python work plus the C calls it makes without releasing the lock, such as uvloop's socket
writes; `wall`: every thread that is not idle). Printed: CPU per token of every thread (from
/proc, with its kernel part, voluntary and involuntary context switches and minor page faults
per step), then each busy thread's frames
by own samples and by inclusive samples. `bench/server_overhead.py` prepares a core
(`prepare`) when none is at hand.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sse_client import ClientProcess

PROMPT = list(range(3, 35))


def thread_times(pid: int) -> dict[str, tuple[float, int, int, float, int]]:
    """CPU seconds, voluntary / involuntary switches, kernel CPU seconds and minor page faults of
    every thread of `pid` and its children, keyed 'PID/TID name'."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    for p in pids:
        for task in Path(f"/proc/{p}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = dict(line.split(":\t") for line in (task / "status").read_text().splitlines() if ":\t" in line)
                key = f"{p}/{task.name} {status['Name'].strip()}"
                out[key] = ((int(fields[11]) + int(fields[12])) / tick, int(status["voluntary_ctxt_switches"]),
                            int(status["nonvoluntary_ctxt_switches"]), int(fields[12]) / tick, int(fields[7]))
            except (FileNotFoundError, ProcessLookupError, KeyError):
                continue
    return out


def print_threads(before: dict, after: dict, num_tokens: int, steps: int) -> None:
    rows = []
    for key, (cpu, vol, nonvol, kernel, faults) in after.items():
        cpu0, vol0, nonvol0, kernel0, faults0 = before.get(key, (0.0, 0, 0, 0.0, 0))
        if cpu - cpu0 > 0:
            rows.append((cpu - cpu0, key, (vol - vol0) / steps, (nonvol - nonvol0) / steps, kernel - kernel0,
                         (faults - faults0) / steps))
    print("| thread (pid/tid name) | CPU us/token | of which kernel | voluntary switches/step | involuntary/step "
          "| minor page faults/step |")
    print("|---|---|---|---|---|---|")
    for cpu, key, vol, nonvol, kernel, faults in sorted(rows, reverse=True):
        print(f"| {key} | {cpu / num_tokens * 1e6:.1f} | {kernel / num_tokens * 1e6:.1f} | {vol:.2f} | {nonvol:.2f} "
              f"| {faults:.1f} |")
    print(f"| all | {sum(r[0] for r in rows) / num_tokens * 1e6:.1f} | {sum(r[4] for r in rows) / num_tokens * 1e6:.1f} "
          f"| | | {sum(r[5] for r in rows):.1f} |")


def print_samples(raw: Path, top: int) -> None:
    """py-spy's raw (collapsed) stacks: per thread, frames by own and by inclusive samples."""
    threads = collections.Counter()
    own = collections.defaultdict(collections.Counter)
    inclusive = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        parts = stack.split(";")
        processes = [p for p in parts if p.startswith("process ")]
        names = [re.sub(r"\(\d+\)", "", p) for p in parts if p.startswith("thread ")]
        frames = [re.sub(r":\d+\)", ")", p) for p in parts if not p.startswith(("process ", "thread "))]
        key = ("engine process " if len(processes) > 1 else "serving process ") + (names[0] if names else "?")
        threads[key] += int(count)
        if frames:
            own[key][frames[-1]] += int(count)
            for frame in set(frames):
                inclusive[key][frame] += int(count)
    total = sum(threads.values()) or 1
    for key, count in threads.most_common():
        print(f"\n## {key}: {count} samples ({count / total:.0%})")
        if count < total * 0.03:
            continue
        for title, counter in (("own", own[key]), ("inclusive", inclusive[key])):
            print(f"  {title}:")
            for frame, n in counter.most_common(top):
                print(f"    {n:6d}  {frame}")


def start_server(args) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "helios.cli.main", "serve", args.core, "--accept", args.accept,
               "--trust", args.trust, "--port", "0", "--max-active", str(args.streams), "--queue-capacity",
               str(args.streams), "--torch-threads", "1", "--log-level", "warning", "--no-access-log",
               *args.server_flag]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    url = process.stdout.readline().split(" on ", 1)[1].split()[0]
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", required=True)
    parser.add_argument("--trust", required=True)
    parser.add_argument("--accept", default="bench.helios/server")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--spy", choices=("gil", "wall", "off"), default="gil")
    parser.add_argument("--rate", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--server-flag", action="append", default=[], metavar="FLAG")
    parser.add_argument("--client-gather-ms", type=float, default=0.5,
                        help="the client's read gathering (bench/sse_client.py; 0: reads at every poll)")
    args = parser.parse_args()
    process, url = start_server(args)
    client = ClientProcess(args.client_gather_ms / 1e3)
    spy = None
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0,
                           "stream": True, "return_token_ids": True}).encode()
        client.round(url, body, args.streams)  # warm-up
        raw = Path(tempfile.mkdtemp()) / "samples.txt"
        if args.spy != "off":
            command = ["py-spy", "record", "--pid", str(process.pid), "--subprocesses", "--threads", "--nonblocking",
                       "--rate", str(args.rate), "--format", "raw", "--output", str(raw)]
            spy = subprocess.Popen(command + (["--gil"] if args.spy == "gil" else []),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        before, started, num_tokens, client_cpu = thread_times(process.pid), time.perf_counter(), 0, 0.0
        client_switches = 0
        for _ in range(args.rounds):
            streams, cpu_s = client.round(url, body, args.streams)
            num_tokens += sum(len(times) for _, times in streams)
            client_cpu += cpu_s
            client_switches += client.last_switches[0]
        elapsed, after = time.perf_counter() - started, thread_times(process.pid)
        steps = max(1, num_tokens // args.streams)
        print(f"{args.rounds} rounds of {args.streams} streams: {num_tokens} tokens in {elapsed:.2f} s; "
              f"client {client_cpu / num_tokens * 1e6:.1f} us CPU per token, "
              f"{client_switches / max(1, num_tokens // args.streams):.1f} wakeups per step ({client.description})\n")
        print_threads(before, after, num_tokens, steps)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
            spy = None
            if raw.is_file():
                print_samples(raw, args.top)
    finally:
        if spy is not None:
            spy.kill()
        client.close()
        process.terminate()
        process.wait(60)


if __name__ == "__main__":
    main()

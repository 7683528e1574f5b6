"""Seconds from starting `helios serve` to its first `/health` 200, for one or more source trees,
alternating run by run (so a machine's drift moves every tree alike), and each tree's median over
the first's. Run from the repository root:

    python bench/serve_ready.py --tree /path/to/other/checkout/src --tree src --rounds 4 [-- SERVE ARGS]

Each `--tree` is put first on PYTHONPATH of a `python -m helios.cli.main serve --port P` process
(without SERVE ARGS: the embedded model, engine process on), which is interrupted once healthy.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ready_seconds(tree: str, serve_args: list[str], timeout_s: float) -> float:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "helios.cli.main", "serve", "--port", str(port), *serve_args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"helios serve ended with {process.returncode}:\n{process.stderr.read().decode()[-3000:]}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"helios serve was not healthy within {timeout_s} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
            time.sleep(POLL_S)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="a source tree (its src directory); repeatable")
    parser.add_argument("--rounds", type=int, default=4, help="starts of each tree (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="starts of the first tree not counted (default 1: caches)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a start may take (default 600)")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: arguments for helios serve")
    args = parser.parse_args()
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    for _ in range(args.warmup):
        ready_seconds(args.tree[0], serve_args, args.timeout)
    times: dict[str, list[float]] = {tree: [] for tree in args.tree}
    for round_ in range(args.rounds):
        for tree in args.tree:
            times[tree].append(ready_seconds(tree, serve_args, args.timeout))
            print(f"round {round_ + 1}: {tree}: {times[tree][-1]:.2f} s", flush=True)
    first = statistics.median(times[args.tree[0]])
    for tree, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{tree}: median {median:.2f} s ({', '.join(f'{s:.2f}' for s in seconds)}), "
              f"{median / first:.2f}x of {args.tree[0]}")


if __name__ == "__main__":
    main()

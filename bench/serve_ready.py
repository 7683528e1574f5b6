"""Seconds from starting `helios serve` to its first `/health` 200, for one or more source trees,
alternating run by run (so a machine's drift moves every tree alike), and each tree's median over
the first's. Run from the repository root:

    python bench/serve_ready.py --tree /path/to/other/checkout/src --tree src --rounds 4 [-- SERVE ARGS]

Each `--tree` is put first on PYTHONPATH of a `python -m helios.cli.main serve --port P` process
(without SERVE ARGS: the embedded model, engine process on), which is interrupted once healthy.
`--warmup N` starts each tree N times first, uncounted (caches, and the records a load keeps).
`--trace` runs each counted start with HELIOS_START_TRACE=1 and prints, for each tree's median start,
when each step of the start was reached in either process (`helios.server.start_trace`), in seconds
after the launch, among the start's other standard-error lines as they were read (progress, log). `--fresh-caches` gives every start (warm-ups too) its own empty Triton and
Inductor caches (a machine's first start: the load's dry run and every kernel compiled).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TRACE = "helios start trace:"


def ready_seconds(tree: str, serve_args: list[str], timeout_s: float, trace: bool = False,
                  fresh_caches: bool = False) -> tuple[float, list[str]]:
    """Seconds from the launch to the first /health 200, and the start's trace lines (with `trace`),
    each as "SECONDS PID STEP" after the launch; with `fresh_caches`, on empty Triton and Inductor caches."""
    if not fresh_caches:
        return _ready_seconds(tree, serve_args, timeout_s, trace, {})
    with tempfile.TemporaryDirectory(prefix="serve-ready-caches-") as caches:
        env = {"TRITON_CACHE_DIR": os.path.join(caches, "triton"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "inductor")}
        return _ready_seconds(tree, serve_args, timeout_s, trace, env)


def _ready_seconds(tree: str, serve_args: list[str], timeout_s: float, trace: bool,
                   extra_env: dict[str, str]) -> tuple[float, list[str]]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env["HELIOS_START_TRACE"] = "1" if trace else "0"
    env.update(extra_env)
    launched = time.time()
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "helios.cli.main", "serve", "--port", str(port), *serve_args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    lines: list[str] = []  # drained as they come: a full pipe would stall the server
    arrivals: list[float] = []  # seconds after the launch each line was read

    def drain() -> None:
        for line in process.stderr:
            arrivals.append(time.monotonic() - started)
            lines.append(line.decode(errors="replace"))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        while True:
            if process.poll() is not None:
                reader.join(5)
                raise SystemExit(f"helios serve ended with {process.returncode}:\n{''.join(lines)[-3000:]}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"helios serve was not healthy within {timeout_s} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        seconds = time.monotonic() - started
                        steps = []
                        for arrived, line in zip(list(arrivals), list(lines)):
                            if line.startswith(TRACE):
                                epoch, _, pid, step = line[len(TRACE):].split(maxsplit=3)
                                steps.append((float(epoch) - launched, f"{pid:>7}  {step.strip()}"))
                            elif line.strip():  # the start's own progress and log lines, as they were read
                                steps.append((arrived, f"{'stderr':>7}  {line.strip()[:160]}"))
                        steps.append((seconds, f"{'':>7}  first /health 200"))
                        return seconds, [f"{at:6.2f} s  {text}" for at, text in sorted(steps, key=lambda s: s[0])]
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
    parser.add_argument("--warmup", type=int, default=1, help="starts of each tree not counted (default 1: caches)")
    parser.add_argument("--trace", action="store_true", help="print each tree's median start step by step")
    parser.add_argument("--fresh-caches", action="store_true",
                        help="every start on its own empty Triton and Inductor caches (a machine's first start)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a start may take (default 600)")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: arguments for helios serve")
    args = parser.parse_args()
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    for _ in range(args.warmup):
        for tree in args.tree:
            ready_seconds(tree, serve_args, args.timeout, fresh_caches=args.fresh_caches)
    times: dict[str, list[float]] = {tree: [] for tree in args.tree}
    traces: dict[str, list[list[str]]] = {tree: [] for tree in args.tree}
    for round_ in range(args.rounds):
        for tree in args.tree:
            seconds, steps = ready_seconds(tree, serve_args, args.timeout, args.trace, args.fresh_caches)
            times[tree].append(seconds)
            traces[tree].append(steps)
            print(f"round {round_ + 1}: {tree}: {times[tree][-1]:.2f} s", flush=True)
    first = statistics.median(times[args.tree[0]])
    for tree, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{tree}: median {median:.2f} s ({', '.join(f'{s:.2f}' for s in seconds)}), "
              f"{median / first:.2f}x of {args.tree[0]}")
    if args.trace:
        for tree, seconds in times.items():
            median = sorted(range(len(seconds)), key=seconds.__getitem__)[len(seconds) // 2]
            print(f"{tree}: round {median + 1}, step by step:")
            print("\n".join(traces[tree][median]))


if __name__ == "__main__":
    main()

"""Adversarial run against `helios serve`: oversized bodies, a flood, disconnects, clients that stop
reading, and SIGTERM under load. Prints what each scenario measured; exits 1 if any rule broke.

    .venv/bin/python bench/adversarial.py [--core MODEL.core --accept NS --trust KEY.pub]
        [--flood 300] [--disconnects 100] [--slow-readers 16] [--sigterm-streams 32]

Not a test (it takes a minute or two). Without --core it serves the tiny random chat checkpoint the
tests use, prepared with a 16,384-token context under a temporary directory (a slow reader's stream
must outgrow the socket buffers). Each scenario starts its own server
subprocess, so one scenario's damage cannot hide in another's figures. Rules checked:

- no 5xx other than a 503 admission rejection, ever;
- oversized bodies get 413 quickly and the server's memory returns (RSS after vs before);
- the flood gets only 200s and 429s, and afterwards every permit is back (metrics gauge 0);
- disconnected streams give their permits back;
- clients that stop reading are dropped after the send timeout and their permits come back while
  other clients are served;
- SIGTERM under load: every stream ends with [DONE] or exactly one "server shutting down" error
  event, the process exits by the signal, and the log holds no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]


@dataclass(frozen=True)
class CoreRef:
    path: Path
    namespace: str
    public_key: Path
    served_id: str


class Server:
    """`helios serve` in a subprocess on a free port; stderr goes to a log file."""

    def __init__(self, core: CoreRef, log: Path, *options: str):
        command = [sys.executable, "-m", "helios.cli.main", "serve", str(core.path), "--accept", core.namespace,
                   "--trust", str(core.public_key), "--port", "0", *options]
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        with open(log, "w") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        line = self.process.stdout.readline()
        if "http://" not in line:
            raise RuntimeError(f"server did not start: {line!r}\n{log.read_text()[-2000:]}")
        self.url = line.split(" on ", 1)[1].split()[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not become healthy")

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def permits_in_use(self) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return float(re.search(r"^helios_admission_permits_in_use (\S+)$", text, re.M).group(1))

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, self.log.read_text()


class Report:
    def __init__(self):
        self.failures: list[str] = []

    def line(self, scenario: str, text: str) -> None:
        print(f"{scenario:<14} {text}", flush=True)

    def check(self, scenario: str, ok: bool, rule: str) -> None:
        if not ok:
            self.failures.append(f"{scenario}: {rule}")
            print(f"{scenario:<14} RULE BROKEN: {rule}", flush=True)


def chat(core: CoreRef, content: str = "What is 2 + 3?", **fields) -> dict:
    return {"model": core.served_id, "messages": [{"role": "user", "content": content}], **fields}


def is_allowed(response: httpx.Response) -> bool:
    if response.status_code < 500:
        return True
    try:
        return response.status_code == 503 and response.json()["error"]["type"] == "admission_rejected"
    except ValueError:
        return False


def wait_permits_zero(server: Server, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    value = server.permits_in_use()
    while value and time.monotonic() < deadline:
        time.sleep(0.1)
        value = server.permits_in_use()
    return value


# -- scenarios -------------------------------------------------------------------------------------


def oversized(core: CoreRef, work: Path, report: Report) -> None:
    server = Server(core, work / "oversized.log")
    before = server.rss_mib()
    cases = [("10 MB body", 10_000_000), ("30 MB body", 30_000_000), ("100 MB body", 100_000_000)]
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for name, size in cases:
            body = json.dumps(chat(core, "x" * size)).encode()
            start = time.perf_counter()
            try:
                response = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
                status = response.status_code
            except httpx.HTTPError as error:  # the server may close before reading a body it refused
                status = type(error).__name__
            took = time.perf_counter() - start
            report.line("oversized", f"{name}: {status} in {took:.2f} s, server RSS {server.rss_mib():.0f} MiB")
            report.check("oversized", status in (413, "RemoteProtocolError", "WriteError", "ReadError"), f"{name} -> 413")
        longest = (4 * 1024 * 1024 - 200) // 1  # just under the default body limit, as text
        start = time.perf_counter()
        response = client.post("/v1/chat/completions", json=chat(core, "y" * longest))
        took = time.perf_counter() - start
        report.line("oversized", f"4 MiB of text (under the body limit): {response.status_code} "
                                 f"{response.json()['error']['type']} in {took:.2f} s")
        report.check("oversized", is_allowed(response), "long text -> no 5xx")
        ok = client.post("/v1/chat/completions", json=chat(core, max_tokens=4))
        report.check("oversized", ok.status_code == 200, "a normal request is served afterwards")
    time.sleep(1)
    after = server.rss_mib()
    report.line("oversized", f"server RSS before {before:.0f} MiB, after {after:.0f} MiB")
    report.check("oversized", after < before + 200, "memory returns after large requests (< +200 MiB)")
    code, log = server.stop()
    report.check("oversized", "Traceback" not in log, "no traceback in the log")


async def _flood(core: CoreRef, url: str, count: int) -> tuple[list[int], list[float], float]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def one(index: int):
            start = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=chat(core, f"n{index}: 2+2?", max_tokens=8))
            return response, time.perf_counter() - start

        start = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(count)))
        wall = time.perf_counter() - start
    return [r.status_code for r, _ in results], [t for r, t in results if r.status_code == 200], wall, \
        all(is_allowed(r) for r, _ in results)


def flood(core: CoreRef, work: Path, report: Report, count: int) -> None:
    server = Server(core, work / "flood.log", "--queue-capacity", "32")
    statuses, latencies, wall, allowed = asyncio.run(_flood(core, server.url, count))
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = sorted(latencies)[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    report.line("flood", f"{count} concurrent requests in {wall:.2f} s: {counts}; 200s p50 {p50:.2f} s p99 {p99:.2f} s")
    report.check("flood", allowed and set(counts) <= {200, 429}, "only 200 and 429")
    report.check("flood", wait_permits_zero(server) == 0, "permits back to zero")
    code, log = server.stop()
    report.check("flood", "Traceback" not in log, "no traceback in the log")


async def _disconnects(core: CoreRef, url: str, count: int) -> int:
    async def one():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async with client.stream("POST", "/v1/chat/completions",
                                     json=chat(core, max_tokens=200, temperature=0, stream=True)) as response:
                async for _line in response.aiter_lines():
                    return 1  # gone after the first chunk
        return 0

    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    return sum(1 for r in results if r == 1)


def disconnects(core: CoreRef, work: Path, report: Report, count: int) -> None:
    server = Server(core, work / "disconnects.log", "--queue-capacity", str(count))
    start = time.perf_counter()
    gone = asyncio.run(_disconnects(core, server.url, count))
    settle = time.perf_counter()
    left = wait_permits_zero(server)
    report.line("disconnects", f"{gone}/{count} streams dropped after their first chunk in "
                               f"{settle - start:.2f} s; permits in use {left:.0f} after {time.perf_counter() - settle:.2f} s")
    report.check("disconnects", left == 0, "permits back to zero")
    ok = httpx.post(server.url + "/v1/chat/completions", json=chat(core, max_tokens=4), timeout=60)
    report.check("disconnects", ok.status_code == 200, "a normal request is served afterwards")
    code, log = server.stop()
    report.check("disconnects", "Traceback" not in log, "no traceback in the log")


def _stalled_stream(core: CoreRef, port: int) -> socket.socket:
    """A streamed request on a socket with a tiny receive buffer that is never read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(chat(core, "Tell me a long story.", max_tokens=15_000, temperature=0, stream=True,
                           return_token_ids=True, return_token_timestamps=True)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def slow_readers(core: CoreRef, work: Path, report: Report, count: int, send_timeout: float = 2.0) -> None:
    """As many clients that never read as there are permits: others get 429 until the send timeout
    drops the stalled responses (once their output outgrew the socket buffers), then 200."""
    active = max(1, count // 2)
    server = Server(core, work / "slow.log", "--max-active", str(active), "--queue-capacity", str(count - active),
                    "--send-timeout", str(send_timeout))
    sockets = [_stalled_stream(core, server.port) for _ in range(count)]
    time.sleep(0.5)
    held = server.permits_in_use()
    locked_out = httpx.post(server.url + "/v1/chat/completions", json=chat(core, max_tokens=4), timeout=60)
    start = time.perf_counter()
    left = wait_permits_zero(server, timeout=300)
    released = time.perf_counter() - start
    served_after = httpx.post(server.url + "/v1/chat/completions", json=chat(core, max_tokens=4), timeout=60)
    for sock in sockets:
        sock.close()
    code, log = server.stop()
    dropped = log.count("dropped: its client took nothing")
    report.line("slow readers", f"{count} clients that never read hold {held:.0f} of {count} permits; another client "
                                f"gets {locked_out.status_code}; {dropped} responses dropped by the {send_timeout:g} s "
                                f"send timeout, permits {left:.0f} after {released:.2f} s (generation until the "
                                f"socket buffers filled, plus the timeout); then another client gets "
                                f"{served_after.status_code}")
    report.check("slow readers", left == 0 and dropped == count, "stalled responses dropped, permits come back")
    report.check("slow readers", served_after.status_code == 200, "other clients are served afterwards")
    report.check("slow readers", "Traceback" not in log, "no traceback in the log")


async def _sigterm(core: CoreRef, server: Server, count: int) -> list[str]:
    started = asyncio.Event()
    num_started = 0

    async def one():
        nonlocal num_started
        lines = []
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                async with client.stream("POST", "/v1/chat/completions",
                                         json=chat(core, max_tokens=220, temperature=0, stream=True)) as response:
                    num_started += 1
                    if num_started == count:
                        started.set()
                    async for line in response.aiter_lines():
                        lines.append(line)
        except httpx.HTTPError as error:
            lines.append(f"transport error {type(error).__name__}")
        return "\n".join(lines)

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    await asyncio.wait_for(started.wait(), 60)
    await asyncio.sleep(0.3)
    server.process.send_signal(signal.SIGTERM)
    return await asyncio.gather(*tasks)


def sigterm(core: CoreRef, work: Path, report: Report, count: int) -> None:
    server = Server(core, work / "sigterm.log", "--max-active", "2", "--queue-capacity", str(count))
    start = time.perf_counter()
    texts = asyncio.run(_sigterm(core, server, count))
    code, log = server.stop()
    took = time.perf_counter() - start
    done = sum(1 for t in texts if t.rstrip().endswith("data: [DONE]"))
    errors = sum(1 for t in texts if t.count("event: error") == 1 and "server shutting down" in t)
    cut = count - done - errors
    tracebacks = log.count("Traceback") + log.count("CancelledError")
    report.line("sigterm", f"{count} streams: {done} finished, {errors} ended with one 'server shutting down' "
                           f"event, {cut} cut without a terminal event; exit {code} after {took:.2f} s; "
                           f"{tracebacks} traceback lines, {len(log.splitlines())} log lines")
    report.check("sigterm", cut == 0, "every stream ends with [DONE] or one error event")
    report.check("sigterm", code == -signal.SIGTERM, "exits by the signal")
    report.check("sigterm", tracebacks == 0, "no traceback in the log")


# -- main ------------------------------------------------------------------------------------------


def tiny_test_core(work: Path, context_tokens: int = 16384) -> CoreRef:
    """The tests' tiny random chat checkpoint, prepared with a context long enough that a stream's
    output outgrows the socket buffers of a client that stops reading."""
    from helios.core.keys import SigningKey, write_key_pair
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
    from ignition.hf_checkpoints import QWEN3
    from support.chat_checkpoint import write_chat_checkpoint
    from support.server_core import NAMESPACE, SERVED_ID

    checkpoint = write_chat_checkpoint(QWEN3, work / "checkpoint", seed=3)
    key = SigningKey.generate()
    write_key_pair(work / "publisher.key", key, [NAMESPACE])
    plan = CapacityPlan(context_tokens=context_tokens, prefill_tokens=32, decode_batches=(1, 4, 8))
    prepare_core(checkpoint, work / "model.core", key, PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan))
    return CoreRef(work / "model.core", NAMESPACE, work / "publisher.key.pub", SERVED_ID)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", type=Path)
    parser.add_argument("--accept")
    parser.add_argument("--trust", type=Path)
    parser.add_argument("--served-id", default=None, help="model name to send (default: the first /v1/models id)")
    parser.add_argument("--flood", type=int, default=300)
    parser.add_argument("--disconnects", type=int, default=100)
    parser.add_argument("--slow-readers", type=int, default=4)
    parser.add_argument("--sigterm-streams", type=int, default=32)
    args = parser.parse_args()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="helios-adversarial-") as scratch:
        work = Path(scratch)
        if args.core:
            core = CoreRef(args.core, args.accept, args.trust, args.served_id or "")
            if not core.served_id:
                probe = Server(core, work / "probe.log")
                core = CoreRef(args.core, args.accept, args.trust,
                               httpx.get(probe.url + "/v1/models").json()["data"][0]["id"])
                probe.stop()
        else:
            core = tiny_test_core(work)
        if only("oversized"):
            oversized(core, work, report)
        if only("flood"):
            flood(core, work, report, args.flood)
        if only("disconnects"):
            disconnects(core, work, report, args.disconnects)
        if only("slow"):
            slow_readers(core, work, report, args.slow_readers)
        if only("sigterm"):
            sigterm(core, work, report, args.sigterm_streams)
    print("all rules held" if not report.failures else f"{len(report.failures)} rule(s) broken: {report.failures}")
    return 1 if report.failures else 0


def only(names: str):
    """Scenarios named in $ADVERSARIAL_ONLY (comma-separated), all by default."""
    chosen = os.environ.get("ADVERSARIAL_ONLY")
    return chosen is None or names in chosen.split(",")


if __name__ == "__main__":
    sys.exit(main())

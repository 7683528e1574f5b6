"""Server overhead: time to first token and time per token through `helios serve` (HTTP, SSE,
admission, preparation, presentation) against the same generation in-process without HTTP.

    .venv/bin/python bench/server_overhead.py [--streams 1 16 64] [--tokens 64] [--rounds 5]
        [--torch-threads 1] [--core MODEL.core --accept NS --trust KEY.pub | --checkpoint DIR]
        [--client raw|httpx] [--client-gather-ms 0.5] [--server-flag=--FLAG ...] [--compare-src TREE]
        [--variant="FLAGS" ...] [--compare-gather-ms MS] [--glibc-thresholds]

Not a test. Without --core, a checkpoint is prepared into a temporary core first (decode batches
1, 4, 16, 64): --checkpoint DIR, else the embedded default model when it is built, else the tiny
random chat checkpoint the tests use. Every request is a greedy text completion of the same
token-id prompt, so both sides generate the same tokens.

- in-process: an engine whose worker thread runs in this process; requests go straight to
  `Engine.submit` and times are read in the token callback (no delivery cost at all). This process
  fixes glibc malloc's thresholds as every engine does by default (`RuntimeOptions.hold_freed_memory`,
  `helios.runtime.host_heap`), so both sides allocate alike; `--glibc-thresholds` leaves glibc's moving
  thresholds here (the model worker then faults a few megabytes in again on some steps, or on
  every step, depending on the order of earlier frees);
- offline:    `helios.runtime.offline.generate` (synchronous, one batch), aggregate tokens/s;
- server:     a `helios serve` subprocess, streamed with return_token_ids (each chunk's ids mark
  their tokens' arrival) by a client in a process of its own (`bench/sse_client.py`: asyncio raw
  sockets, minimal HTTP/1.1 and SSE reading), so that the client's work neither lands on the
  measured process nor dominates the shared cores; `--client httpx` streams with asyncio httpx
  clients in this process instead (the earlier client; it costs about as much CPU per token as
  the server's event loop).

How the benchmark keeps measuring the server although its client shares the two cores: the client
is a process of its own (its CPU and context switches are reported apart: "CPU ms/token client",
"client switches/step"), and it gathers its reads (`--client-gather-ms`, default 0.5): once data
arrived it sleeps that long before polling again, so the one write per stream per step that the
server makes is read in a few wakeups a step rather than up to one per write (a remote client's
wakeups would not land on the server's cores at all, and each wakeup here can preempt the model
worker). Tokens are timed when read, at most the gather time after arrival, so the time per token
moves by at most gather / (tokens - 1) (under 0.01 ms at 64 tokens). `--client-gather-ms 0` reads
at every poll; `--compare-gather-ms MS` adds a server whose client gathers MS instead, in the same
interleaved rounds.

`--compare-src TREE` also starts a server from another source tree (TREE/src, e.g. an export of
the main branch, on its PYTHONPATH) and runs its rounds interleaved with this tree's (alternating
which goes first), then prints both side by side: on a shared machine whose load moves by more
than a change saves, that is the comparison that holds.

`--variant="FLAGS"` (repeatable; with the `=`, as FLAGS start with a dash) also starts a server
from this tree with FLAGS added (e.g. `--variant=--no-access-log` or
`--variant="--stream-interval 2"`), interleaved and reported the same way. The servers run with
`helios serve`'s access log on (its default: one line per request on stderr) unless the flags say
`--no-access-log`; the report says which.

Both sides use the same torch thread count and run interleaved (one in-process round, one server
round, ...) so that load from other processes hits both alike; "paired rounds" is the median over
rounds of each server round's median per-token time over that of the in-process round just before
it (less moved by load that changes during the run than the ratio of the medians over all rounds). Per stream: TTFT = first token -
submission; per-token = (last token - first token) / (n - 1); medians over all streams of all
rounds. CPU ms/token is CPU time of the serving side (this process during in-process rounds; the
server process and its children, every thread, during server rounds) over tokens generated: the least noisy
measure of the server's own work on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sse_client import ClientProcess

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench.helios/server"
PROMPT = tuple(range(3, 35))
IN_PROCESS_HOLDS_FREED_MEMORY = True  # --glibc-thresholds: False


@dataclass(frozen=True)
class CoreRef:
    path: Path
    namespace: str
    public_key: Path


@dataclass
class Samples:
    ttft_s: list[float] = field(default_factory=list)
    per_token_s: list[float] = field(default_factory=list)
    round_per_token_s: list[float] = field(default_factory=list)  # each round's median over its streams
    cpu_s: float = 0.0
    client_switches: int = 0  # the client's voluntary context switches (wakeups)
    serving_cpu_s: float = 0.0  # of `cpu_s`, the serving process's own (without the engine process)
    client_cpu_s: float = 0.0
    num_tokens: int = 0

    def add(self, submitted: float, token_times: list[float]) -> None:
        self.ttft_s.append(token_times[0] - submitted)
        if len(token_times) > 1:
            self.per_token_s.append((token_times[-1] - token_times[0]) / (len(token_times) - 1))
        self.num_tokens += len(token_times)


def prepare(scratch: Path, checkpoint: Path | None) -> CoreRef:
    sys.path.insert(0, str(REPO / "tests"))
    from helios.core.keys import SigningKey, write_key_pair
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core

    if checkpoint is None:
        from helios.embedded import default_model_dir

        if (default_model_dir() / "config.json").is_file():
            checkpoint = default_model_dir()
        else:
            from ignition.hf_checkpoints import QWEN3
            from support.chat_checkpoint import write_chat_checkpoint

            checkpoint = write_chat_checkpoint(QWEN3, scratch / "checkpoint", seed=3)
    print(f"preparing {checkpoint} ...", file=sys.stderr, flush=True)
    key = SigningKey.generate()
    public = write_key_pair(scratch / "bench.key", key, [NAMESPACE])
    plan = CapacityPlan(context_tokens=512, prefill_tokens=64, decode_batches=(1, 4, 16, 64))
    prepare_core(checkpoint, scratch / "model.core", key, PrepareOptions(NAMESPACE, capacities=plan))
    return CoreRef(scratch / "model.core", NAMESPACE, public)


def process_cpu_s(pid: int, with_children: bool = True) -> float:
    """CPU seconds of `pid` and (`with_children`) its live descendants (an engine process included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if not with_children:
        return total
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += process_cpu_s(int(child))
    return total


# -- in-process ----------------------------------------------------------------------------------


class InProcess:
    """A started engine in this process; `round(level)` runs `level` requests to their end."""

    def __init__(self, core: CoreRef, tokens: int):
        from helios.core.reader import open_core
        from helios.runtime.service import RuntimeOptions, build_runtime

        self.runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]),
                                     RuntimeOptions(hold_freed_memory=IN_PROCESS_HOLDS_FREED_MEMORY))
        self.eos = self.runtime.model.settings.eos_token_ids
        self.tokens = tokens
        self.runtime.engine.start()
        self._count = 0

    def round(self, level: int, samples: Samples | None) -> None:
        from helios.runtime.engine import EngineRequest
        from helios.runtime.records.events import TokenEvent
        from helios.runtime.records.request import RequestSpec

        times: dict[str, list[float]] = {}
        done = threading.Semaphore(0)

        def on_event(event) -> None:
            if isinstance(event, TokenEvent):
                times[event.request_id].extend([time.perf_counter()] * len(event.token_ids))
            else:
                done.release()

        submitted = {}
        cpu = time.process_time()
        for _ in range(level):
            self._count += 1
            request_id = f"bench-{self._count}"
            times[request_id] = []
            spec = RequestSpec(request_id, PROMPT, self.tokens, frozenset(self.eos))
            submitted[request_id] = time.perf_counter()
            self.runtime.engine.submit(EngineRequest(spec, on_event))
        for _ in range(level):
            done.acquire()
        if samples is not None:
            samples.cpu_s += time.process_time() - cpu
            for request_id, started in submitted.items():
                samples.add(started, times[request_id])

    def close(self) -> None:
        self.runtime.engine.shutdown()


def offline_rates(core: CoreRef, levels: list[int], tokens: int) -> dict[int, float]:
    from helios.core.reader import open_core
    from helios.runtime.offline import generate
    from helios.runtime.service import RuntimeOptions, build_runtime

    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]),
                            RuntimeOptions(hold_freed_memory=IN_PROCESS_HOLDS_FREED_MEMORY))
    eos = runtime.model.settings.eos_token_ids
    rates = {}
    for level in levels:
        generate(runtime.engine, [PROMPT] * level, tokens, eos)  # warm-up (greedy)
        started = time.perf_counter()
        results = generate(runtime.engine, [PROMPT] * level, tokens, eos)
        rates[level] = sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)
    return rates


# -- server --------------------------------------------------------------------------------------


class Server:
    """A `helios serve` subprocess; `round(level)` streams `level` requests at once."""

    def __init__(self, core: CoreRef, max_active: int, tokens: int, torch_threads: int, client: str,
                 extra: tuple[str, ...] = (), source: Path | None = None, gather_s: float = 0.0):
        """`source`: the `src` folder the server imports helios from (None: this process's)."""
        command = [sys.executable, "-m", "helios.cli.main", "serve", str(core.path), "--accept", core.namespace,
                   "--trust", str(core.public_key), "--port", "0", "--max-active", str(max_active),
                   "--queue-capacity", str(max_active), "--torch-threads", str(torch_threads),
                   "--log-level", "warning", *extra]
        env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        self.url = self.process.stdout.readline().split(" on ", 1)[1].split()[0]
        self.tokens = tokens
        deadline = time.monotonic() + 120
        while not self._is_healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)
        self.served_id = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]
        self.client = ClientProcess(gather_s) if client == "raw" else None
        self.client_cpu_s = 0.0

    def _is_healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health").status_code == 200
        except httpx.TransportError:
            return False

    def round(self, level: int, samples: Samples | None) -> None:
        cpu, own = process_cpu_s(self.process.pid), process_cpu_s(self.process.pid, with_children=False)
        if self.client is not None:
            streams, client_cpu_s = self.client.round(self.url, json.dumps(self._body()).encode(), level)
            client_switches = self.client.last_switches[0]
        else:
            started = time.process_time()
            streams = asyncio.run(self._streams(level))
            client_cpu_s, client_switches = time.process_time() - started, 0
        if samples is not None:
            samples.cpu_s += process_cpu_s(self.process.pid) - cpu
            samples.serving_cpu_s += process_cpu_s(self.process.pid, with_children=False) - own
            samples.client_cpu_s += client_cpu_s
            samples.client_switches += client_switches
            for submitted, token_times in streams:
                samples.add(submitted, token_times)

    async def _streams(self, level: int):
        limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as client:
            return await asyncio.gather(*(self._one(client) for _ in range(level)))

    def _body(self) -> dict:
        return {"model": self.served_id, "prompt": list(PROMPT), "max_tokens": self.tokens, "temperature": 0,
                "stream": True, "return_token_ids": True}

    async def _one(self, client: httpx.AsyncClient) -> tuple[float, list[float]]:
        body = self._body()
        token_times = []
        submitted = time.perf_counter()
        async with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"token_ids"' in line:
                    count = len(json.loads(line[6:])["choices"][0]["token_ids"])
                    token_times.extend([time.perf_counter()] * count)
        return submitted, token_times

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.process.terminate()
        self.process.wait(60)


# -- report --------------------------------------------------------------------------------------


def report(levels, tokens, local: dict[int, Samples], served: dict[int, Samples], rates: dict[int, float],
           client: ClientProcess | None, server_flags: tuple[str, ...]) -> None:
    described = client.description if client is not None else "asyncio httpx clients in the benchmark process"
    print(f"\nprompt {len(PROMPT)} ids, up to {tokens} greedy tokens per stream; medians over streams (ms)")
    print(f"client: {described}; server flags: {' '.join(server_flags) or '(defaults)'}; "
          f"access log {access_log_state(server_flags)}; load average at the end {os.getloadavg()[0]:.2f} "
          f"(1 min; above the core count the in-process side is itself short of CPU)\n")
    print("| streams | TTFT in-process | TTFT server | TTFT overhead | ms/token in-process | ms/token server "
          "| overhead/token | server/in-process per token | CPU ms/token in-process | CPU ms/token server "
          "| CPU ms/token client | client switches/step | offline tok/s | paired rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for level in levels:
        a, b = local[level], served[level]
        ttft_a, ttft_b = statistics.median(a.ttft_s) * 1e3, statistics.median(b.ttft_s) * 1e3
        tok_a, tok_b = statistics.median(a.per_token_s) * 1e3, statistics.median(b.per_token_s) * 1e3
        cpu_a, cpu_b = a.cpu_s / a.num_tokens * 1e3, b.cpu_s / b.num_tokens * 1e3
        cpu_client = b.client_cpu_s / b.num_tokens * 1e3
        print(f"| {level} | {ttft_a:.1f} | {ttft_b:.1f} | {ttft_b - ttft_a:+.1f} | {tok_a:.2f} | {tok_b:.2f} "
              f"| {tok_b - tok_a:+.2f} | {tok_b / tok_a:.2f}x | {cpu_a:.3f} | {cpu_b:.3f} | {cpu_client:.3f} "
              f"| {b.client_switches / (b.num_tokens / level):.1f} | {rates[level]:.0f} | {paired_ratio(b, a):.2f}x |")


def access_log_state(flags) -> str:
    """Whether `helios serve` with `flags` writes its access log (on by default)."""
    state = "on (helios serve's default)"
    for flag in flags:
        if flag == "--no-access-log":
            state = "off (--no-access-log)"
        elif flag == "--access-log":
            state = "on"
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--core")
    parser.add_argument("--accept", default=NAMESPACE)
    parser.add_argument("--trust")
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="raw: bench/sse_client.py in its own process (default); httpx: in this process")
    parser.add_argument("--client-gather-ms", type=float, default=0.5,
                        help="the raw client sleeps this long after data arrived before polling again (0: never)")
    parser.add_argument("--compare-gather-ms", type=float, metavar="MS",
                        help="also serve this tree to a client gathering MS, interleaved, and report it beside")
    parser.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                        help="extra `helios serve` argument (repeatable, e.g. --server-flag=--engine-thread)")
    parser.add_argument("--compare-src", type=Path, metavar="TREE",
                        help="also serve from this source tree (TREE/src), interleaved, and report it beside this tree")
    parser.add_argument("--variant", action="append", default=[], metavar="FLAGS",
                        help="also serve from this tree with FLAGS added (one string; repeatable), interleaved")
    parser.add_argument("--glibc-thresholds", action="store_true",
                        help="leave glibc malloc's moving thresholds in this process (the in-process side)")
    args = parser.parse_args()
    global IN_PROCESS_HOLDS_FREED_MEMORY
    IN_PROCESS_HOLDS_FREED_MEMORY = not args.glibc_thresholds
    import torch

    torch.set_num_threads(args.torch_threads)
    with tempfile.TemporaryDirectory() as scratch:
        core = CoreRef(Path(args.core), args.accept, Path(args.trust)) if args.core else prepare(Path(scratch), args.checkpoint)
        rates = offline_rates(core, args.streams, args.tokens)
        sides = {"in-process": InProcess(core, args.tokens)}
        gather_s = args.client_gather_ms / 1e3
        server = functools.partial(Server, core, max(args.streams), args.tokens, args.torch_threads, args.client,
                                   tuple(args.server_flag), gather_s=gather_s)
        sides["server"] = server()
        if args.compare_src is not None:
            tree = args.compare_src / "src" if (args.compare_src / "src").is_dir() else args.compare_src
            sides[f"server ({args.compare_src})"] = server(source=tree.resolve())
        for flags in args.variant:
            sides[f"server {flags}"] = functools.partial(
                Server, core, max(args.streams), args.tokens, args.torch_threads, args.client,
                (*args.server_flag, *shlex.split(flags)), gather_s=gather_s)()
        if args.compare_gather_ms is not None:
            sides[f"server, client gather {args.compare_gather_ms:g} ms"] = functools.partial(
                Server, core, max(args.streams), args.tokens, args.torch_threads, args.client,
                tuple(args.server_flag), gather_s=args.compare_gather_ms / 1e3)()
        try:
            samples = run_rounds(sides, args.streams, args.rounds)
        finally:
            for side in sides.values():
                side.close()
    report(args.streams, args.tokens, samples["in-process"], samples["server"], rates, sides["server"].client,
           tuple(args.server_flag))
    print(f"\nin-process malloc thresholds: {'glibc (moving)' if args.glibc_thresholds else 'held (as helios serve)'}")
    if len(sides) > 2:
        report_comparison(args.streams, samples)


def run_rounds(sides: dict, levels: list[int], rounds: int) -> dict[str, dict[int, Samples]]:
    """Per level: a warm-up round of each side, then `rounds` rounds of each, interleaved (the
    in-process side first, the servers in alternating order)."""
    samples = {name: {level: Samples() for level in levels} for name in sides}
    servers = [name for name in sides if name != "in-process"]
    for level in levels:
        for side in sides.values():
            side.round(level, None)  # warm-up
        for k in range(rounds):
            for name in ["in-process", *(servers if k % 2 == 0 else servers[::-1])]:
                s = samples[name][level]
                first = len(s.per_token_s)
                sides[name].round(level, s)
                s.round_per_token_s.append(statistics.median(s.per_token_s[first:]))
    return samples


def paired_ratio(side: Samples, local: Samples) -> float:
    """The median over rounds of a side's per-token time over the in-process round just before it
    (rounds close in time see about the same load from other work)."""
    return statistics.median(b / a for a, b in zip(local.round_per_token_s, side.round_per_token_s))


def report_comparison(levels, samples: dict[str, dict[int, Samples]]) -> None:
    names = list(samples)
    print("\nthe same rounds, every side (medians over streams; CPU of the serving side and of the client)\n")
    print("| streams | side | ms/token | / in-process | paired rounds | CPU ms/token | of which serving process "
          "| CPU ms/token client | client switches/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for level in levels:
        local = statistics.median(samples["in-process"][level].per_token_s)
        for name in names:
            s = samples[name][level]
            per_token = statistics.median(s.per_token_s)
            print(f"| {level} | {name} | {per_token * 1e3:.2f} | {per_token / local:.2f}x "
                  f"| {paired_ratio(s, samples['in-process'][level]):.2f}x | {s.cpu_s / s.num_tokens * 1e3:.3f} "
                  f"| {s.serving_cpu_s / s.num_tokens * 1e3:.3f} | {s.client_cpu_s / s.num_tokens * 1e3:.3f} "
                  f"| {s.client_switches / max(1, s.num_tokens / level):.1f} |")


if __name__ == "__main__":
    main()

"""HTTP against in-process serving on one GPU, on the same core, in one run.

Builds a random Llama-3.1-8B-shaped checkpoint in bf16 (`--layers` makes it shallower for a quick
run), prepares it into a core (`bench/gpu_serving.py`'s plan: decode batches for every stream
count) and serves it twice at once, with the same cache pages:

- in-process: a runtime in this process whose engine runs in its model worker thread, as under the
  server; requests go straight to `Engine.submit` and their token events are counted in the callback;
- HTTP: `helios serve --device cuda` in a subprocess (its model worker in an engine process, the
  default, or with `--server-modes thread` a thread of the server process); streamed `/v1/completions` requests (token-id
  prompts, ``temperature: 0``, ``stream_options.include_usage``) from `--client-processes` client
  processes (asyncio + httpx), so that the clients' own parsing is spread over host cores; each
  client opens one connection per stream before the round's clock starts (a client reusing its
  connections: a fresh httpx client's first request costs the client itself 25-150 ms).

For each stream count: one warm-up round per side, then `--rounds` rounds, alternating in-process
and HTTP, each round `streams` requests of `--prompt` prompt tokens and up to `--output` greedy output
tokens (both sides stop at the core's EOS ids; fresh prompts every round, the same on both sides, so
neither reuses cached prefixes). Output tokens/s of a round = output tokens of all its requests over
the time from the first submission to the last request's end; a side's rate is the median over
rounds. Prints a table with the HTTP / in-process ratio per stream count; `--json PATH` writes every
number. `--smoke` runs tiny shapes on the CPU (checks the script, not a measurement).

    python bench/http_serving.py [--layers 32] [--streams 1 64 256] [--prompt 128] [--output 128]
        [--rounds 3] [--client-processes 8] [--server-modes process thread] [--server-flag=--FLAG ...]
        [--json out.json] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench/gpu"  # gpu_serving.prepare signs for this namespace
PAGE_TOKENS = 16


def log(line: str) -> None:
    print(line, flush=True)


def prompts(count: int, length: int, vocab: int, salt: int) -> list[list[int]]:
    """Distinct token-id prompts, different for every salt (no prefix reuse between rounds)."""
    return [[(r * 7919 + i * 31 + salt * 104729) % (vocab - 16) + 16 for i in range(length)] for r in range(count)]


@dataclass
class Side:
    """One side's rounds: output tokens/s of each measured round, and each round's median time from
    the round's start to a request's first output token (`first_token_ms`)."""

    rates: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    first_token_ms: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


# -- in-process ----------------------------------------------------------------------------------


class InProcess:
    """A started runtime in this process."""

    def __init__(self, core: Path, public_key, num_pages: int, queue_capacity: int):
        from helios.core.reader import open_core
        from helios.runtime.loading.model import LoadOptions
        from helios.runtime.service import RuntimeOptions, build_runtime

        started = time.perf_counter()
        options = RuntimeOptions(load=LoadOptions(device="cuda" if _has_cuda() else "cpu", num_pages=num_pages),
                                 queue_capacity=queue_capacity)
        self.runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[public_key]), options)
        self.eos = tuple(self.runtime.model.settings.eos_token_ids)
        self.runtime.engine.start()
        self._count = 0
        log(f"in-process runtime loaded in {time.perf_counter() - started:.0f} s")

    def round(self, batch: list[list[int]], output: int) -> tuple[int, float, float]:
        """Runs `batch` to its end; (output tokens, seconds from the first submission to the last end,
        median seconds from the first submission to a request's first token)."""
        from helios.runtime.engine import EngineRequest
        from helios.runtime.records.events import FinishEvent, TokenEvent
        from helios.runtime.records.request import RequestSpec

        lock, done = threading.Lock(), threading.Semaphore(0)
        counts = [0]
        failures, firsts, seen = [], [], set()

        def on_event(event) -> None:
            if isinstance(event, TokenEvent):
                with lock:
                    counts[0] += len(event.token_ids)
                    if event.request_id not in seen:
                        seen.add(event.request_id)
                        firsts.append(time.perf_counter() - started)
            elif isinstance(event, FinishEvent):
                if event.reason.name not in ("EOS", "LENGTH"):
                    failures.append(f"{event.reason.name}: {event.message}")
                done.release()

        started = time.perf_counter()
        for prompt in batch:
            self._count += 1
            spec = RequestSpec(f"bench-{self._count}", tuple(prompt), output, frozenset(self.eos))
            self.runtime.engine.submit(EngineRequest(spec, on_event))  # greedy
        for _ in batch:
            done.acquire()
        elapsed = time.perf_counter() - started
        if failures:
            raise RuntimeError(f"in-process requests failed: {failures[:3]}")
        return counts[0], elapsed, statistics.median(firsts)

    def close(self) -> None:
        self.runtime.close()


# -- HTTP ----------------------------------------------------------------------------------------


class Server:
    """`helios serve` in a subprocess on the same core and pages."""

    def __init__(self, core: Path, public_key: Path, num_pages: int, max_active: int, queue_capacity: int,
                 start_timeout_s: float, mode: str = "process", extra: tuple[str, ...] = ()):
        device = "cuda" if _has_cuda() else "cpu"
        command = [sys.executable, "-m", "helios.cli.main", "serve", str(core), "--accept", NAMESPACE,
                   "--trust", str(public_key), "--device", device, "--port", "0", "--pages", str(num_pages),
                   "--max-active", str(max_active), "--queue-capacity", str(queue_capacity),
                   "--log-level", "warning", "--no-access-log",
                   "--engine-process" if mode == "process" else "--no-engine-process", *extra]
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if " on " not in line:
            raise RuntimeError(f"helios serve did not start (exit {self.process.poll()}): {line!r}")
        self.url = line.split(" on ", 1)[1].split()[0]
        self._wait_healthy(start_timeout_s)
        import httpx

        self.model = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]
        log(f"server ready at {self.url} in {time.perf_counter() - started:.0f} s")

    def _wait_healthy(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not become healthy")
            time.sleep(0.2)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def http_round(pool: ProcessPoolExecutor, server: Server, batch: list[list[int]], output: int,
               num_clients: int) -> tuple[int, float, float]:
    """Streams `batch` through the server from the client processes, all starting at one instant;
    (output tokens, seconds to the last stream's end, median seconds to a stream's first token)."""
    shares = [batch[k::num_clients] for k in range(num_clients)]
    start_at = time.monotonic() + 0.5  # every client process is ready and waiting by then
    futures = [pool.submit(client_streams, server.url, server.model, share, output, start_at)
               for share in shares if share]
    results = [f.result() for f in futures]
    tokens = sum(r[0] for r in results)
    ended = max(r[1] for r in results)
    errors = [e for r in results for e in r[2]]
    if errors:
        raise RuntimeError(f"HTTP requests failed: {errors[:3]}")
    return tokens, ended - start_at, statistics.median(first - start_at for r in results for first in r[3])


def client_streams(url: str, model: str, batch: list[list[int]], output: int, start_at: float):
    """In a client process: streams every prompt of `batch` at once from `start_at` (monotonic);
    (output tokens, monotonic end of the last stream, errors, each stream's monotonic first token)."""
    return asyncio.run(_client_streams(url, model, batch, output, start_at))


async def _client_streams(url: str, model: str, batch, output: int, start_at: float):
    import httpx

    limits = httpx.Limits(max_connections=len(batch), max_keepalive_connections=len(batch))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        # One kept-alive connection per stream before the clock starts, as a client that reuses its
        # connections has: a new httpx client's first request costs it 25-150 ms of its own (this
        # machine), which the in-process side does not pay.
        await asyncio.gather(*(client.get("/health") for _ in batch))
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        results = await asyncio.gather(*(_one_stream(client, model, prompt, output) for prompt in batch))
    errors = [r for r in results if isinstance(r, str)]
    counted = [r for r in results if not isinstance(r, str)]
    return sum(r[0] for r in counted), time.monotonic(), errors, [r[1] for r in counted]


async def _one_stream(client, model: str, prompt: list[int], output: int) -> tuple[int, float] | str:
    """(output tokens, monotonic time of the first chunk with a token) or an error line."""
    # `return_token_ids`: a chunk for every token. Without it a token whose text is empty sends none,
    # and most of a random checkpoint's tokens are ids past its small tokenizer, which decode to "":
    # such a stream carried a handful of chunks where a trained model's carries one a token.
    body = {"model": model, "prompt": prompt, "max_tokens": output, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    last = first = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = line
                if first is None and '"token_ids"' in line:
                    first = time.monotonic()
    if last is None:
        return "no data"
    usage = json.loads(last[6:]).get("usage")
    return (usage["completion_tokens"], first if first is not None else time.monotonic()) if usage else "no usage chunk"


def _warm_client(_: int) -> int:
    import httpx  # noqa: F401 - imported once per client process before the clock starts

    return os.getpid()


# -- main ----------------------------------------------------------------------------------------


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run(args, core: Path, public_key: Path, vocab: int) -> dict:
    levels = sorted(set(args.streams))
    num_pages = max(levels) * -(-(args.prompt + args.output) // PAGE_TOKENS) + 32
    queue = max(levels) + 8
    local = InProcess(core, public_key, num_pages, queue)
    pool = ProcessPoolExecutor(args.client_processes, mp_context=get_context("spawn"))
    results: dict = {"modes": {}}
    try:
        list(pool.map(_warm_client, range(args.client_processes * 2)))
        for mode in args.server_modes:
            server = Server(core, public_key, num_pages, max(levels), queue, args.start_timeout, mode,
                            tuple(args.server_flag))
            try:
                results["modes"][mode] = {"levels": run_levels(args, levels, local, server, pool, vocab, mode)}
            finally:
                server.close()
    finally:
        pool.shutdown(cancel_futures=True)
        local.close()
    return results


def run_levels(args, levels, local: InProcess, server: Server, pool, vocab: int, mode: str) -> dict:
    """Every stream count against one server: alternating in-process and HTTP rounds."""
    rows = {}
    for level in levels:
        ours, http = Side(), Side()
        warm = prompts(level, args.prompt, vocab, salt=1000 + level)
        local.round(warm, args.output)
        http_round(pool, server, prompts(level, args.prompt, vocab, salt=2000 + level), args.output,
                   args.client_processes)
        for r in range(args.rounds):
            batch = prompts(level, args.prompt, vocab, salt=10 * level + r)  # the same for both sides
            tokens, seconds, first = local.round(batch, args.output)
            ours.rates.append(tokens / seconds)
            ours.tokens.append(tokens)
            ours.first_token_ms.append(first * 1e3)
            tokens, seconds, first = http_round(pool, server, prompts(level, args.prompt, vocab,
                                                                      salt=5000 + 10 * level + r),
                                                args.output, args.client_processes)
            http.rates.append(tokens / seconds)
            http.tokens.append(tokens)
            http.first_token_ms.append(first * 1e3)
        ours_first, http_first = statistics.median(ours.first_token_ms), statistics.median(http.first_token_ms)
        rows[level] = {"in_process": ours.__dict__, "http": http.__dict__, "in_process_tok_s": ours.median,
                       "http_tok_s": http.median, "ratio": http.median / ours.median,
                       "in_process_first_token_ms": ours_first, "http_first_token_ms": http_first}
        log(f"{level} streams, engine {mode}: in-process {ours.median:.1f} tok/s, HTTP {http.median:.1f} tok/s, "
            f"HTTP/in-process {http.median / ours.median:.3f}; first token (median) in-process {ours_first:.1f} ms, "
            f"HTTP {http_first:.1f} ms")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers of the 8B shape (default 32)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--output", type=int, default=128, help="output tokens per request (at most)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per side and stream count")
    parser.add_argument("--client-processes", type=int, default=8, help="HTTP client processes")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds the server may take to load")
    parser.add_argument("--server-modes", nargs="+", choices=("process", "thread"), default=["process"],
                        help="how `helios serve` runs its model worker: an engine process (its default) "
                        "and/or a thread of the server process (--no-engine-process); one server per mode, in turn")
    parser.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                        help="extra `helios serve` argument (repeatable, e.g. --server-flag=--stream-interval=2)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script)")
    args = parser.parse_args()
    if args.smoke:
        args.streams, args.prompt, args.output, args.rounds = [1, 4], 16, 8, 1
        args.client_processes = min(args.client_processes, 2)

    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_serving import Workload, prepare  # noqa: E402
    from random_llama import LLAMA_31_8B, SMOKE, with_layers  # noqa: E402

    from helios.core.keys import SigningKey, write_key_pair

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --smoke on the CPU)")
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    device = torch.device("cpu" if args.smoke else "cuda")
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
        f"{shape.num_hidden_layers} layers ({shape.parameters() / 1e9:.2f}B parameters), {args.dtype}; "
        f"streams {args.streams}, {args.prompt} prompt / {args.output} output tokens, greedy; "
        f"server flags: {' '.join(args.server_flag) or '(none)'}")
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        public_key = write_key_pair(Path(scratch) / "bench.key", key, [NAMESPACE])
        workloads = [Workload(n, args.prompt, args.output) for n in sorted(set(args.streams))]
        core = prepare(shape, workloads, Path(scratch), key, args.dtype, ttft_prompt=args.prompt, device=device)
        results = run(args, core, public_key, shape.vocab_size)
    results.update({"layers": shape.num_hidden_layers, "dtype": args.dtype, "prompt": args.prompt,
                    "server_flags": list(args.server_flag),
                    "output": args.output, "torch": torch.__version__})
    log("")
    log(f"| model worker | streams | in-process tok/s | HTTP tok/s | HTTP / in-process | first token in-process / HTTP "
        f"(ms) |  ({args.prompt} prompt / {args.output} output tokens, greedy, median of {args.rounds} rounds)")
    log("|---|---|---|---|---|---|")
    for mode, result in results["modes"].items():
        for level, row in result["levels"].items():
            log(f"| {mode} | {level} | {row['in_process_tok_s']:.1f} | {row['http_tok_s']:.1f} | {row['ratio']:.3f}x "
                f"| {row['in_process_first_token_ms']:.1f} / {row['http_first_token_ms']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Server overhead: time to first token and time per token through `helios serve` (HTTP, SSE,
admission, preparation, presentation) against the same generation in-process without HTTP.

    .venv/bin/python bench/server_overhead.py [--streams 1 16 64] [--tokens 64] [--rounds 3]
        [--core MODEL.core --accept NS --trust KEY.pub | --checkpoint DIR]

Not a test. Without --core, a checkpoint is prepared into a temporary core first (decode batches
1, 4, 16, 64): --checkpoint DIR, else the embedded default model when it is built, else the tiny
random chat checkpoint the tests use. Every request is a greedy text completion of the same
token-id prompt, so both sides generate the same tokens (EOS can end a request early; counts are
per request).

- in-process: the engine's worker thread runs, requests go straight to `Engine.submit`, and times
  are read in the token callback (no delivery cost at all);
- offline:    `helios.runtime.offline.generate` (synchronous, all requests in one batch), for
  aggregate tokens/s;
- server:     a `helios serve` subprocess; asyncio httpx clients in this process stream with
  return_token_ids (one metadata chunk per generated id marks each token's arrival), timing from
  sending the request to each token's chunk.

Per stream: TTFT = first token - submission; per-token = (last token - first token) / (n - 1).
The table shows medians over all streams of all rounds. On a 2-core machine the client, the
server's event loop and its model worker share the cores; the numbers include that contention.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench.helios/server"
PROMPT = list(range(3, 35))


@dataclass(frozen=True)
class CoreRef:
    path: Path
    namespace: str
    public_key: Path


@dataclass(frozen=True)
class Stream:
    ttft_s: float
    per_token_s: float | None
    num_tokens: int


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


def summarize(streams: list[Stream]) -> tuple[float, float]:
    ttft = statistics.median(s.ttft_s for s in streams)
    per_token = statistics.median(s.per_token_s for s in streams if s.per_token_s is not None)
    return ttft, per_token


def stream_of(submitted: float, token_times: list[float]) -> Stream:
    per_token = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return Stream(token_times[0] - submitted, per_token, len(token_times))


# -- in-process ----------------------------------------------------------------------------------


def in_process(core: CoreRef, levels: list[int], tokens: int, rounds: int) -> dict[int, list[Stream]]:
    from helios.core.reader import open_core
    from helios.runtime.engine import EngineRequest
    from helios.runtime.events import TokenEvent
    from helios.runtime.packer import AdmissionValues
    from helios.runtime.request import RequestSpec
    from helios.runtime.service import build_runtime

    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]))
    eos = runtime.model.settings.eos_token_ids
    engine = runtime.engine
    engine.start()
    results: dict[int, list[Stream]] = {}
    counter = 0
    try:
        for level in levels:
            results[level] = []
            for round_index in range(rounds + 1):  # the first round warms up
                times: dict[str, list[float]] = {}
                done = threading.Semaphore(0)

                def on_event(event, times=times, done=done) -> None:
                    if isinstance(event, TokenEvent):
                        times[event.request_id].extend([time.perf_counter()] * len(event.token_ids))
                    else:
                        done.release()

                submitted = {}
                for _ in range(level):
                    counter += 1
                    request_id = f"bench-{counter}"
                    times[request_id] = []
                    spec = RequestSpec(request_id, tuple(PROMPT), tokens, frozenset(eos))
                    admission = AdmissionValues(tuple(PROMPT), 0, (0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0), tokens, eos)
                    submitted[request_id] = time.perf_counter()
                    engine.submit(EngineRequest(spec, admission, on_event))
                for _ in range(level):
                    done.acquire()
                if round_index:
                    results[level] += [stream_of(submitted[r], times[r]) for r in submitted]
    finally:
        engine.shutdown()
    return results


def offline(core: CoreRef, levels: list[int], tokens: int) -> dict[int, float]:
    from helios.core.reader import open_core
    from helios.runtime.offline import generate
    from helios.runtime.service import build_runtime

    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]))
    eos = runtime.model.settings.eos_token_ids
    rates = {}
    for level in levels:
        generate(runtime.engine, [PROMPT] * level, tokens, eos)  # warm-up
        started = time.perf_counter()
        results = generate(runtime.engine, [PROMPT] * level, tokens, eos)
        rates[level] = sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)
    return rates


# -- server --------------------------------------------------------------------------------------


def start_server(core: CoreRef, max_active: int) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "helios.cli.main", "serve", str(core.path), "--accept", core.namespace,
               "--trust", str(core.public_key), "--port", "0", "--max-active", str(max_active),
               "--queue-capacity", str(max_active), "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    url = line.split(" on ", 1)[1].split()[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


async def one_stream(client: httpx.AsyncClient, served_id: str, tokens: int) -> Stream:
    body = {"model": served_id, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "return_token_ids": True}
    token_times = []
    submitted = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"token_ids"' in line:
                count = len(json.loads(line[6:])["choices"][0]["token_ids"])
                token_times.extend([time.perf_counter()] * count)
    return stream_of(submitted, token_times)


def through_server(core: CoreRef, levels: list[int], tokens: int, rounds: int) -> dict[int, list[Stream]]:
    process, url = start_server(core, max(levels))
    served_id = httpx.get(url + "/v1/models").json()["data"][0]["id"]

    async def run_level(level: int) -> list[Stream]:
        limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
            streams = []
            for round_index in range(rounds + 1):
                batch = await asyncio.gather(*(one_stream(client, served_id, tokens) for _ in range(level)))
                if round_index:
                    streams += batch
            return streams

    try:
        return {level: asyncio.run(run_level(level)) for level in levels}
    finally:
        process.terminate()
        process.wait(60)


# -- report --------------------------------------------------------------------------------------


def report(levels, tokens, local, rates, served) -> None:
    print(f"\nprompt {len(PROMPT)} ids, {tokens} greedy tokens per stream; medians over streams (ms)\n")
    print("| streams | TTFT in-process | TTFT server | TTFT overhead | ms/token in-process | ms/token server "
          "| overhead/token | offline tok/s | server tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for level in levels:
        local_ttft, local_tok = summarize(local[level])
        server_ttft, server_tok = summarize(served[level])
        server_rate = level / server_tok if server_tok else float("nan")
        print(f"| {level} | {local_ttft * 1e3:.1f} | {server_ttft * 1e3:.1f} | {(server_ttft - local_ttft) * 1e3:+.1f} "
              f"| {local_tok * 1e3:.2f} | {server_tok * 1e3:.2f} | {(server_tok - local_tok) * 1e3:+.2f} "
              f"| {rates[level]:.0f} | {server_rate:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core")
    parser.add_argument("--accept", default=NAMESPACE)
    parser.add_argument("--trust")
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.core:
            core = CoreRef(Path(args.core), args.accept, Path(args.trust))
        else:
            core = prepare(Path(scratch), args.checkpoint)
        local = in_process(core, args.streams, args.tokens, args.rounds)
        rates = offline(core, args.streams, args.tokens)
        served = through_server(core, args.streams, args.tokens, args.rounds)
    report(args.streams, args.tokens, local, rates, served)


if __name__ == "__main__":
    main()

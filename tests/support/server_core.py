"""A tiny prepared chat core for server tests, prepared once per test session, and a server process.

`tiny_core(base)` prepares a random Qwen3-shaped checkpoint with the test tokenizer and chat
template (think tags and tool-call tags, so reasoning and tool parsing are active) into
`base/helios-server-core/` the first time it is called with that base, and reuses it afterwards;
test modules pass pytest's session base directory so that all of them share one core (under
pytest-xdist, the run's directory above the workers' bases: one core for all the workers).

`served_tiny_core(base, ...)` serves that core in this process (a started `ServedModel`, shut down
on exit), as the ASGI-level server tests use it; `post_chats` sends chat bodies (`chat_body`) to its
app concurrently, and `assert_serving` checks it still answers with no admission permit held.

`ServerProcess` runs `helios serve` on a free loopback port in a subprocess, waits for /health and
stops it with SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from support.shared_prepare import prepared_once, shared_root

NAMESPACE = "test.helios/server"
SERVED_ID = "tiny-chat"
CONTEXT_TOKENS = 256


@contextlib.contextmanager
def served_tiny_core(base: Path, queue_capacity: int = 4, runtime_options=None, **served_options):
    """The tiny core (`tiny_core(base)`) served in this process: a started `ServedModel` with
    `queue_capacity` and `served_options` (frontend_workers, owned_by, ...), over a runtime built
    with `runtime_options` (default: RuntimeOptions(queue_capacity=queue_capacity)); shut down on exit."""
    from helios.core.reader import open_core
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.service import ServedModel

    core = tiny_core(base)
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    runtime = build_runtime(opened, runtime_options or RuntimeOptions(queue_capacity=queue_capacity))
    served = ServedModel.from_runtime(runtime, queue_capacity=queue_capacity, **served_options)
    served.start()
    try:
        yield served
    finally:
        served.shutdown()


def serve_args(*argv: str) -> argparse.Namespace:
    """The parsed arguments of `helios serve *argv` (as `helios.cli.main` parses them)."""
    from helios.cli.main import build_parser

    argv = ("serve", *argv)
    return build_parser(list(argv)).parse_args(list(argv))


def chat_body(**fields) -> dict:
    """A chat request body for the served tiny core: one user message and `fields`."""
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": "Give an answer"}], **fields}


def post_chats(app, *bodies: dict) -> list[httpx.Response]:
    """The responses of `app` (ASGI, in process) to chat `bodies`, posted concurrently."""
    import asyncio

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for body in bodies))

    return asyncio.run(scenario())


async def post_json(app, path: str, body: dict) -> httpx.Response:
    """`body` posted to `app` in process (ASGI transport)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as client:
        return await client.post(path, json=body)


def sse_chunks(text: str) -> list[dict]:
    """The JSON chunks of an SSE body, ``[DONE]`` left out."""
    return [json.loads(line[len("data: "):]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def assert_serving(app, served) -> None:
    """`app` answers a short chat request, and no admission permit of `served` stays held."""
    (ok,) = post_chats(app, chat_body(max_tokens=2))
    assert ok.status_code == 200, ok.text
    assert served.admission.in_use == 0


def openai_client(served):
    """The official `openai` async client over `served`'s app in process (ASGI: no socket)."""
    import openai

    from helios.server.app import create_app

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


@dataclass(frozen=True)
class TinyCore:
    path: Path
    public_key: Path
    namespace: str = NAMESPACE
    served_id: str = SERVED_ID


def tiny_core(base: Path, name: str = "helios-server-core", plan=None) -> TinyCore:
    """The tiny Qwen3 chat checkpoint prepared under `plan` (a CapacityPlan; by default CONTEXT_TOKENS of context,
    32-token prefill steps, decode batches 1, 4 and 8), once per run in the directory `name` under `base`'s
    shared root, for every module and xdist worker that asks."""
    from helios.core.keys import SigningKey, load_signing_key, write_key_pair
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
    from ignition.hf_checkpoints import QWEN3
    from support.chat_checkpoint import write_chat_checkpoint

    root = shared_root(base) / name
    core = TinyCore(root / "model.core", root / "publisher.key.pub")

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=3)
        key_path = root / "publisher.key"
        if key_path.is_file():
            key = load_signing_key(key_path)
        else:
            key = SigningKey.generate()
            write_key_pair(key_path, key, [NAMESPACE])
        capacities = plan or CapacityPlan(context_tokens=CONTEXT_TOKENS, prefill_tokens=32, decode_batches=(1, 4, 8))
        scratch = root / "model.core.partial"
        prepare_core(checkpoint, scratch, key, PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=capacities))
        scratch.rename(core.path)

    prepared_once(root, core.path, prepare)
    return core


def scored_core(base: Path) -> TinyCore:
    """The tiny Qwen3 chat checkpoint prepared with scored prefill (echo with log-probabilities, prompt_logprobs):
    128 tokens of context, 16-token prefill steps, decode batches of 4 (a lone request decodes in one of its
    rows) and mixed steps, once per run in `scored-core` under `base`'s shared root. test_prompt_scores,
    test_echo_offsets, test_full_context_scores, test_stream_parity and test_logprobs_reference's dense core all
    serve this one core."""
    from helios.ignition.export import CapacityPlan

    return tiny_core(base, "scored-core", CapacityPlan(context_tokens=128, prefill_tokens=16, decode_batches=(4,),
                                                       scored_prefill=True))


class ServerProcess:
    """`helios serve CORE --port 0 ...` in a subprocess; `url` once started."""

    def __init__(self, core: TinyCore, *options: str, log: Path):
        command = [sys.executable, "-m", "helios.cli.main", "serve", str(core.path), "--accept", core.namespace,
                   "--trust", str(core.public_key), "--port", "0", "--log-level", "info", *options]
        self.log = log
        with open(log, "w") as stderr:  # a file, not a pipe: a chatty server must never block on it
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.url = self._read_url()
        self._wait_healthy()

    def _read_url(self) -> str:
        line = self.process.stdout.readline()
        if "http://" not in line:
            self.process.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.log.read_text()}")
        return line.split(" on ", 1)[1].split()[0]

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.process.kill()
        raise RuntimeError("server did not become healthy")

    def terminate(self, timeout: float = 30.0) -> tuple[int, str]:
        """SIGTERM, then the exit status and stderr (killed if it does not exit within `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        self.process.stdout.close()
        return self.process.returncode, self.log.read_text()


def read_stream(url: str, started: threading.Event, max_tokens: int = 220) -> str:
    """A greedy streamed chat request to a served tiny core: its SSE lines (or the transport error
    that ended it), `started` set once the response began."""
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    lines = []
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                started.set()
                lines.extend(response.iter_lines())
    except httpx.HTTPError as error:
        lines.append(f"transport error: {type(error).__name__}")
    return "\n".join(lines)

"""The HTTP app over a two-rank core (rank 1 a local process): /v1/completions returns what the
app returns over the one-rank core, and once rank 1 dies /health reports 503 and completions
are refused with 503 instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import replace

import httpx
import torch

from helios.runtime.parallel.rank_peers import PeerKind
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from ignition.hf_checkpoints import QWEN3_MOE

from .conftest import FAST, MAX_TOKENS, NAMESPACE, PROMPTS

HANG_GUARD_S = 120


@contextlib.contextmanager
def serving(core, ranks=FAST):
    runtime = build_runtime(core, RuntimeOptions(ranks=ranks))
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=1, owned_by=NAMESPACE)
    served.start()
    try:
        yield create_app(served), runtime
    finally:
        runtime.close()


async def call(app, method: str, path: str, body: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await client.request(method, path, json=body)


def completion_ids(app, prompt: list[int]) -> list[int]:
    body = {"model": NAMESPACE, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    response = asyncio.run(call(app, "POST", "/v1/completions", body))
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def test_a_two_rank_core_serves_one_rank_tokens_and_reports_a_lost_rank(cores):
    with serving(cores.open(cores.core(QWEN3_MOE, 1))) as (app, _):
        expected = [completion_ids(app, prompt) for prompt in PROMPTS]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # (one each below: a second intra-op thread of each rank only spins on 2 cores)
    try:
        with serving(cores.open(cores.core(QWEN3_MOE, 2)), replace(FAST, peers=PeerKind.PROCESSES)) as (app, runtime):
            # rank zero shares its intra-op threads with its CPU rank process (test_rank_threads' rule) and
            # gets them back once its peers close, also after one was lost (below)
            assert torch.get_num_threads() == 1
            assert [completion_ids(app, prompt) for prompt in PROMPTS] == expected
            lose_rank_one(app, runtime)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def lose_rank_one(app, runtime) -> None:
    """Kills rank 1's process: /health turns 503 and completions are refused with 503."""
    assert asyncio.run(call(app, "GET", "/health")).status_code == 200
    (pid,) = runtime.peers.local_pids
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + HANG_GUARD_S
    while asyncio.run(call(app, "GET", "/health")).status_code != 503:
        assert time.monotonic() < deadline, "/health still reports healthy"
        time.sleep(0.05)
    body = {"model": NAMESPACE, "prompt": PROMPTS[2], "max_tokens": MAX_TOKENS}
    assert asyncio.run(call(app, "POST", "/v1/completions", body)).status_code == 503

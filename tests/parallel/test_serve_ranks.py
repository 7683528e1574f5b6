"""A two-rank core served by `helios serve` (the model worker in its engine process, rank 1 a local
process of its own): streamed greedy completions over HTTP equal the one-rank core's tokens, and
SIGTERM ends the server, its engine process and the rank cleanly."""

from __future__ import annotations

import json
import signal

import httpx

from ignition.hf_checkpoints import LLAMA3
from support.server_core import ServerProcess, TinyCore

from .conftest import MAX_TOKENS, NAMESPACE, PROMPTS


def _stream_ids(url: str, model: str, prompt: list[int]) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "return_token_ids": True}
    ids: list[int] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ids.extend(json.loads(line[6:])["choices"][0].get("token_ids") or [])
    return ids


def test_a_two_rank_core_serves_the_one_rank_tokens_through_the_engine_process(cores, tmp_path):
    family = LLAMA3  # its two-rank core and reference tokens serve test_families and test_rank_frames too
    expected = cores.reference_tokens(family)
    core = TinyCore(cores.core(family, 2), cores.trust, NAMESPACE)
    process = ServerProcess(core, "--collective-timeout", "20", log=tmp_path / "server.log")
    try:
        model = httpx.get(process.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        assert [_stream_ids(process.url, model, prompt) for prompt in PROMPTS] == expected
    finally:
        code, log = process.terminate()
    assert code == -signal.SIGTERM and "Traceback" not in log, log

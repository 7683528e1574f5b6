"""`helios serve` under load, and its shutdown: more clients than admission permits, slow readers,
and SIGTERM with a response in flight.

The load server admits 3 requests (max-active 2 + queue-capacity 1). Every outcome is checked,
none is timed: rejected clients get 429, admitted ones get their complete stream, a paused reader
holds back neither the engine nor the other streams, and nothing hangs (every wait has a deadline).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from support.server_core import SERVED_ID, ServerProcess, tiny_core

NUM_CLIENTS = 24


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def server(core, tmp_path_factory):
    process = ServerProcess(core, "--max-active", "2", "--queue-capacity", "1",
                            log=tmp_path_factory.mktemp("serve-load") / "server.log")
    yield process
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Traceback" not in log, log


def chat(content: str = "hello", **fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": content}], "stream": True, **fields}


def data_lines(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def metric(url: str, line_prefix: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(predicate, message: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def test_overload_gets_429_and_every_admitted_request_completes(server):
    async def one(client: httpx.AsyncClient, seed: int) -> tuple[int, str]:
        response = await client.post("/v1/chat/completions", json=chat(max_tokens=48, seed=seed))
        return response.status_code, response.text

    async def crowd():
        limits = httpx.Limits(max_connections=NUM_CLIENTS)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, seed) for seed in range(NUM_CLIENTS)))

    before = metric(server.url, 'helios_http_responses_total{endpoint="chat",status="429"}')
    results = asyncio.run(crowd())
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 429} and 429 in statuses and 200 in statuses
    for status, text in results:
        if status == 429:
            assert json.loads(text)["error"]["type"] == "overloaded"
        else:
            lines = data_lines(text)
            assert lines[-1] == "[DONE]"
            assert json.loads(lines[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    after = metric(server.url, 'helios_http_responses_total{endpoint="chat",status="429"}')
    assert after - before == statuses.count(429)
    wait_for(lambda: metric(server.url, "helios_requests_active") == 0, "slots were not released")


def test_a_paused_reader_slows_neither_the_engine_nor_other_streams(server):
    finished = 'helios_requests_finished_total{reason="length"}'
    before = metric(server.url, finished)
    slow_body = chat(max_tokens=120, temperature=0, return_token_ids=True)
    with httpx.Client(base_url=server.url, timeout=60) as slow, httpx.Client(base_url=server.url, timeout=60) as fast:
        with slow.stream("POST", "/v1/chat/completions", json=slow_body) as paused:
            lines = paused.iter_lines()
            assert next(lines).startswith("data: ")  # the reader takes its first event, then pauses
            other = fast.post("/v1/chat/completions", json=chat("the weather", max_tokens=16, temperature=0))
            assert data_lines(other.text)[-1] == "[DONE]"
            # the paused request was generated to its end too: the engine does not wait for readers
            wait_for(lambda: metric(server.url, finished) >= before + 2, "the paused request did not finish")
            rest = "\n".join(lines)
    events = data_lines(rest)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(data) for data in events[:-1]]
    observed = [c for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    assert len(observed) == 120  # nothing was lost while the reader was paused
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_sigterm_drains_the_response_in_flight_and_refuses_new_connections(core, tmp_path):
    process = ServerProcess(core, log=tmp_path / "server.log")
    body = chat(max_tokens=150, temperature=0)
    with httpx.Client(base_url=process.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.process.send_signal(signal.SIGTERM)
            wait_for(lambda: _refuses_connections(process.url), "the server kept accepting connections")
            rest = "\n".join(lines)
    events = data_lines(rest)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Application shutdown complete" in log, log


def _refuses_connections(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
    except httpx.TransportError:
        return True
    return False

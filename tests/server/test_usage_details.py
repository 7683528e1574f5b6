"""Usage details over HTTP (`helios.frontend.responses.presentation.usage_body`,
`helios.server.choice_stream.merged_usage`): ``prompt_tokens_details.cached_tokens`` is the engine's
count of prompt tokens the prefix cache served (``reused_prompt_tokens``), each prompt once;
``completion_tokens_details.reasoning_tokens`` the generated tokens inside reasoning, summed over
the choices; JSON bodies, the usage chunk and continuous usage alike. Reasoning runs on the tiny
chat checkpoint prepared with a template whose generation prompt opens it (``<think>``), so every
token before the first ``</think>`` is reasoning."""

from __future__ import annotations

import json

import pytest

from support.chat_checkpoint import CHAT_TEMPLATE
from support.server_core import SERVED_ID, post_json, sse_chunks

NAMESPACE = "test.helios/usage-details"
EOS_ID, THINK_ID, CLOSE_ID = 1, 2, 3  # support.chat_checkpoint: <|im_end|>, <think>, </think>
LONG = "the weather in paris is sunny; in london it rains. " * 3  # a prompt of several 16-token pages
# The tiny template (`support.chat_checkpoint`) with reasoning opened by the generation prompt and no
# wrapping inside the tags (so no token's text is held as the close delimiter's possible wrapping).
OPEN_TEMPLATE = CHAT_TEMPLATE.replace(
    "<think>\n{{ message.reasoning_content }}\n</think>\n\n", "<think>{{ message.reasoning_content }}</think>"
).replace("<|im_start|>assistant\n{%- endif -%}", "<|im_start|>assistant\n<think>{%- endif -%}")
assert OPEN_TEMPLATE.count("<think>") == 2 and "\n</think>" not in OPEN_TEMPLATE


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny chat checkpoint with `OPEN_TEMPLATE`, prepared once per run, served in this process."""
    from helios.core.keys import SigningKey, load_signing_key, write_key_pair
    from helios.core.reader import open_core
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.service import ServedModel
    from ignition.hf_checkpoints import QWEN3
    from support.chat_checkpoint import write_chat_checkpoint
    from support.shared_prepare import prepared_once, shared_root

    root = shared_root(tmp_path_factory.getbasetemp()) / "usage-details-core"

    def prepare() -> None:
        checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=3)
        config = json.loads((checkpoint / "tokenizer_config.json").read_text())
        (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": OPEN_TEMPLATE}))
        write_key_pair(root / "publisher.key", SigningKey.generate(), [NAMESPACE])
        plan = CapacityPlan(context_tokens=128, prefill_tokens=32, decode_batches=(4,))
        prepare_core(checkpoint, root / "model.partial", load_signing_key(root / "publisher.key"),
                     PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan))
        (root / "model.partial").rename(root / "model.core")

    prepared_once(root, root / "model.core", prepare)
    opened = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=4)), queue_capacity=4,
                                      frontend_workers=1)
    served.start()
    try:
        yield served
    finally:
        served.shutdown()


def _reasoning_of(token_ids: list[int]) -> int:
    """The reference count: the generated tokens before the first ``</think>`` (the prompt opened
    reasoning), an EOS not counted."""
    end = token_ids.index(CLOSE_ID) if CLOSE_ID in token_ids else len(token_ids)
    return sum(token_id != EOS_ID for token_id in token_ids[:end])


def _chat(content: str, **fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": content}], "return_token_ids": True, **fields}


CLOSE_SOON = {str(THINK_ID): -100, str(CLOSE_ID): 4.0}  # some choices close reasoning, some do not
# every token is reasoning: no EOS, no close, and no second <think> (markup inside reasoning, not counted)
STILL_REASONING = {str(EOS_ID): -100, str(CLOSE_ID): -100, str(THINK_ID): -100}


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_tokens_are_every_choices_tokens_before_the_close_delimiter(runner, app, stream):
    body = _chat("hello", n=4, seed=1, max_tokens=10, logit_bias=CLOSE_SOON, stream=stream,
                 stream_options={"include_usage": True} if stream else None)
    response = runner.run(post_json(app, "/v1/chat/completions", body))
    assert response.status_code == 200, response.text
    if stream:
        chunks = sse_chunks(response.text)
        token_ids: dict[int, list[int]] = {}
        for chunk in chunks:
            for choice in chunk["choices"]:
                token_ids.setdefault(choice["index"], []).extend(choice.get("token_ids", []))
        outputs, usage = [token_ids[index] for index in sorted(token_ids)], chunks[-1]["usage"]
    else:
        outputs, usage = [choice["token_ids"] for choice in response.json()["choices"]], response.json()["usage"]
    expected = [_reasoning_of(ids) for ids in outputs]
    assert any(CLOSE_ID in ids for ids in outputs) and any(CLOSE_ID not in ids for ids in outputs), outputs
    assert usage["completion_tokens_details"] == {"reasoning_tokens": sum(expected)}, (outputs, usage)
    assert usage["completion_tokens"] == sum(map(len, outputs))


@pytest.mark.parametrize("shape", ["chat", "chat_n", "text", "text_batch"])
@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_are_the_prompt_tokens_the_prefix_cache_served(runner, app, shape, stream):
    """A second identical request finds the first's pages: its ``cached_tokens`` is the engine's
    count (``reused_prompt_tokens``, whole pages, never the last prompt token), each prompt once."""
    text = f"{shape} {stream} {LONG}"
    fields = {"max_tokens": 2, "return_token_ids": True, "n": 2 if shape == "chat_n" else 1, "stream": stream,
              "stream_options": {"include_usage": True} if stream else None, "logit_bias": STILL_REASONING}
    if shape.startswith("chat"):
        path, body = "/v1/chat/completions", _chat(text, **fields)
    else:
        path, body = "/v1/completions", {"model": SERVED_ID, "prompt": [text, text + " again"] if shape == "text_batch"
                                         else text, **fields}
    seen = []
    for _ in range(2):
        response = runner.run(post_json(app, path, body))
        assert response.status_code == 200, response.text
        final = sse_chunks(response.text)[-1] if stream else response.json()
        seen.append((final["usage"], final["reused_prompt_tokens"]))
    (first, first_reused), (second, reused) = seen
    assert 16 <= reused < second["prompt_tokens"] and second["prompt_tokens"] == first["prompt_tokens"]
    if shape == "text_batch":  # the batch's second prompt finds its first's pages: both prompts count
        assert first["prompt_tokens_details"]["cached_tokens"] > first_reused == 0
        assert second["prompt_tokens_details"]["cached_tokens"] > reused
    else:
        assert first["prompt_tokens_details"] == {"cached_tokens": first_reused}
        assert second["prompt_tokens_details"] == {"cached_tokens": reused}
    assert second["completion_tokens_details"] == {"reasoning_tokens": 0 if shape.startswith("text") else 2 * body["n"]}


def test_continuous_usage_ends_with_the_final_usage_details_included(runner, app):
    body = _chat(f"continuous {LONG}", n=2, max_tokens=3, stream=True, logit_bias=STILL_REASONING,
                 stream_options={"include_usage": True, "continuous_usage_stats": True})
    for _ in range(2):  # the second finds the first's pages
        chunks = sse_chunks(runner.run(post_json(app, "/v1/chat/completions", body)).text)
    usages = [chunk["usage"] for chunk in chunks]
    final = usages[-1]
    assert final["prompt_tokens_details"]["cached_tokens"] > 0
    assert final["completion_tokens_details"] == {"reasoning_tokens": 6}
    assert usages[-2] == final  # the last choice chunk's
    assert all(set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"} for usage in usages[:-3])


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_token_after_a_complete_tool_call_finishes_with_tool_calls(runner, app, stream):
    """The forced call's ``</tool_call>`` is the client's stop token: the output holds the call, and
    its finish reason is ``tool_calls`` (vLLM's reading of a stop after tool calls), not ``stop``."""
    closer = 5  # support.chat_checkpoint: </tool_call>
    body = _chat("weather?", tools=[WEATHER], tool_choice="required", stop_token_ids=[closer], max_tokens=100,
                 logit_bias={str(CLOSE_ID): 100}, temperature=0, stream=stream)  # reasoning closes, then the call
    response = runner.run(post_json(app, "/v1/chat/completions", body))
    assert response.status_code == 200, response.text
    if stream:
        chunks = sse_chunks(response.text)
        reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
        ids = [i for chunk in chunks for c in chunk["choices"] for i in c.get("token_ids", [])]
        calls = [d for chunk in chunks for c in chunk["choices"] for d in c["delta"].get("tool_calls") or []]
    else:
        choice = response.json()["choices"][0]
        reasons, ids, calls = [choice["finish_reason"]], choice["token_ids"], choice["message"].get("tool_calls")
    assert ids[-1] == closer and calls and calls[0]["function"]["name"] == "get_weather", response.text
    assert reasons == ["tool_calls"]

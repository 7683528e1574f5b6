"""``tool_choice: "none"`` with tools declared: the tools stay in the prompt (vLLM's default since 0.10,
``--exclude-tools-when-tool-choice-none`` off: the model is told what exists) and no call is parsed or
allowed: a call the model writes is answer text. They were dropped from the prompt, so the chat's
``usage.prompt_tokens`` disagreed with ``/tokenize`` of the same messages and tools (which has no tool
choice and renders declared tools) and with vLLM's prompt."""

from __future__ import annotations

from helios.server.schemas import ChatCompletionRequest
from helios.server.schemas_tokenize import TokenizeChatRequest
from helios.server.tokenize import tokenize_chat

from .served import ids_of, qwen_model, run_output

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def test_tool_choice_none_renders_the_tools_and_parses_no_call(qwen_tokenizer):
    model = qwen_model(qwen_tokenizer)
    fields = {"model": model.served_id, "messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    none = model.prepare_chat(ChatCompletionRequest.model_validate({**fields, "tools": [WEATHER], "tool_choice": "none"}))
    auto = model.prepare_chat(ChatCompletionRequest.model_validate({**fields, "tools": [WEATHER]}))
    bare = model.prepare_chat(ChatCompletionRequest.model_validate(fields))
    tokenized = tokenize_chat(model, TokenizeChatRequest.model_validate({**fields, "tools": [WEATHER]}))
    assert none.prompt_token_ids == auto.prompt_token_ids == tokenized != bare.prompt_token_ids
    assert none.grammar is None
    _, final = run_output(none, ids_of(qwen_tokenizer, CALL, "<|im_end|>"))
    choice = none.response_body(final)["choices"][0]
    assert not choice["message"].get("tool_calls") and choice["message"]["content"] == CALL
    assert choice["finish_reason"] == "stop"
    _, final = run_output(auto, ids_of(qwen_tokenizer, CALL, "<|im_end|>"))
    assert auto.response_body(final)["choices"][0]["finish_reason"] == "tool_calls"

"""The chat template: tools, tool calls and tool responses render in the documented syntax, the
same way under transformers and plain jinja2, and the shipped copy is the training source."""

from __future__ import annotations

import json

import pytest
import transformers
from default_model_render import ChatRenderer, load_template_text
from jinja2.sandbox import ImmutableSandboxedEnvironment

from helios.embedded import default_model_dir, default_tools

WEATHER_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 3}'},
]


def _expected_text() -> str:
    tools = "".join(json.dumps(tool) + "\n" for tool in default_tools())
    return (
        "<|im_start|>system\nAnswer briefly.\n\nYou may call these tools:\n<tools>\n" + tools + "</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temperature_c": 3}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_conversation_with_tools_and_tool_response_renders_exactly():
    text = ChatRenderer(load_template_text()).render(CONVERSATION, default_tools(), add_generation_prompt=True)
    assert text == _expected_text()


def test_shipped_template_is_the_training_template():
    directory = default_model_dir()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config["chat_template"] == load_template_text()
    assert (directory / "chat_template.jinja").read_text() == load_template_text()


def test_transformers_renders_the_same_text():
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_dir())
    text = tokenizer.apply_chat_template(CONVERSATION, tools=default_tools(), add_generation_prompt=True, tokenize=False)
    assert text == _expected_text()


@pytest.mark.parametrize("trim", [True, False])
def test_plain_jinja2_renders_the_same_apart_from_key_order(trim):
    environment = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim)
    template = environment.from_string(load_template_text())
    text = template.render(messages=CONVERSATION, tools=default_tools(), add_generation_prompt=True)
    sorted_tools = "".join(json.dumps(tool, sort_keys=True) + "\n" for tool in default_tools())
    ordered_tools = "".join(json.dumps(tool) + "\n" for tool in default_tools())
    assert text == _expected_text().replace(ordered_tools, sorted_tools)


def test_reasoning_content_and_typed_arguments_render_in_history():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Convert 12.5 USD to EUR."}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "convert_currency",
                                              "arguments": {"amount": 12.5, "from": "USD", "to": "EUR"}}}]},
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "  Two results.\n"},
    ]
    text = ChatRenderer(load_template_text()).render(messages)
    assert text == (
        "<|im_start|>user\nConvert 12.5 USD to EUR.<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n<function=convert_currency>\n<parameter=amount>\n12.5\n</parameter>\n"
        "<parameter=from>\nUSD\n</parameter>\n<parameter=to>\nEUR\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo results.\n</think>\n\nDone.<|im_end|>\n"
    )


def test_plain_conversation_has_no_system_turn_and_opens_the_assistant_turn():
    text = ChatRenderer(load_template_text()).render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

"""The shipped weights: load in transformers, answer held-out arithmetic, call tools properly."""

from __future__ import annotations

import json

import default_model_data as data
import pytest
import torch
import transformers
from default_model_checkpoint import file_sha256
from default_model_eval import parse_output, typed_arguments

from helios.embedded import default_model_dir, default_tools

# Prompts that do not occur in the training set (checked below); the training script measures
# accuracy on hundreds more, these only show that the shipped files work together.
ARITHMETIC = {
    "What is 487 + 356?": "843",
    "What is 999 + 1?": "1000",
    "Compute 905 - 78.": "827",
    "Calculate 250 minus 619.": "-369",
    "Multiply 47 by 8.": "376",
    "What is 73 * 6?": "438",
}
TOOL_PROMPTS = {
    "What's the weather like in Lisbon?": ("get_weather", {"city": "Lisbon"}),
    "Hey, what's the weather in Lisbon?": ("get_weather", {"city": "Lisbon"}),
}


@pytest.fixture(scope="module")
def model_and_tokenizer():
    directory = default_model_dir()
    model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(directory)


def _record() -> dict:
    return json.loads((default_model_dir() / "training_run.json").read_text())


def _complete(model, tokenizer, messages, tools=None) -> str:
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=120, do_sample=False)
    return tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=False)


def test_weights_match_the_training_record_and_stay_small():
    weights = default_model_dir() / "model.safetensors"
    assert file_sha256(weights) == _record()["model_sha256"]
    assert weights.stat().st_size < 5 * 2**20


def test_probe_prompts_are_held_out():
    record = _record()["config"]
    seen = {c.first_user_text for c in data.training_conversations(record["seed"], record["conversations"], default_tools())}
    assert not (set(ARITHMETIC) | set(TOOL_PROMPTS)) & seen


def test_greedy_arithmetic_is_right_and_reasoned(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    for question, result in ARITHMETIC.items():
        parsed = parse_output(_complete(model, tokenizer, [{"role": "user", "content": question}]))
        assert parsed.well_formed and parsed.reasoning
        assert parsed.content.endswith(f"= {result}."), (question, parsed)


def test_tool_prompt_gives_a_valid_call_and_the_answer_uses_the_result(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    for question, (name, arguments) in TOOL_PROMPTS.items():
        messages = [{"role": "user", "content": question}]
        parsed = parse_output(_complete(model, tokenizer, messages, default_tools()))
        assert parsed.call is not None and parsed.call[0] == name
        assert typed_arguments(parsed.call, default_tools()) == arguments
        call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"city": "Lisbon", "temperature_c": 21,
                                                                          "condition": "sunny"})},
        ]
        final = parse_output(_complete(model, tokenizer, messages, default_tools()))
        assert final.well_formed and "21 C" in final.content and "sunny" in final.content

"""Held-out evaluation of the default model: output parsing, tool-call validation, greedy decoding.

`parse_output` reads one raw completion (special tokens kept, ending at `<|im_end|>` when the model
stopped) in the two shapes the model is trained to produce:
  answer:    `<think>\\nREASONING\\n</think>\\n\\nANSWER<|im_end|>`
  tool call: `<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call><|im_end|>`
Anything else parses as malformed. `score` turns completions of `EvalItem`s into the numbers the
training script reports.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from default_model_conversation import Conversation, ToolCall

EOS = "<|im_end|>"
_ANSWER = re.compile(r"<think>\n(?P<reasoning>(?s:.*?\S.*?))\n</think>\n\n(?P<content>(?s:.*))<\|im_end\|>")
_CALL = re.compile(r"<tool_call>\n<function=(?P<name>[^>\n]+)>\n(?P<params>(?s:.*?))</function>\n</tool_call><\|im_end\|>")
_PARAM = re.compile(r"<parameter=(?P<key>[^>\n]+)>\n(?P<value>(?s:.*?))\n</parameter>\n")
_SPECIALS = ("<|im_start|>", EOS, "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
             "</tool_response>", "<|pad|>")
ARITHMETIC_KINDS = ("add", "sub", "mul")


@dataclass(frozen=True)
class ParsedOutput:
    """A completion's shape: exactly one of `content` (with `reasoning`) or `call` is set when
    `well_formed`; `call` holds raw parameter strings in generation order."""

    well_formed: bool
    reasoning: str | None = None
    content: str | None = None
    call: tuple[str, tuple[tuple[str, str], ...]] | None = None


def parse_output(text: str) -> ParsedOutput:
    answer = _ANSWER.fullmatch(text)
    if answer and not any(token in answer["reasoning"] + answer["content"] for token in _SPECIALS):
        return ParsedOutput(True, reasoning=answer["reasoning"], content=answer["content"])
    call = _CALL.fullmatch(text)
    if call:
        params = tuple((m["key"], m["value"]) for m in _PARAM.finditer(call["params"]))
        if "".join(m.group(0) for m in _PARAM.finditer(call["params"])) == call["params"]:
            return ParsedOutput(True, call=(call["name"], params))
    return ParsedOutput(False)


def typed_arguments(call: tuple[str, tuple[tuple[str, str], ...]], tools: list[dict]) -> dict[str, Any] | None:
    """The call's arguments converted by the declared schema, or None when the call names no
    declared tool or its arguments are not schema-valid (missing, extra, repeated, wrong type)."""
    name, params = call
    schema = next((t["function"]["parameters"] for t in tools if t["function"]["name"] == name), None)
    if schema is None or len({key for key, _ in params}) != len(params):
        return None
    properties, required = schema.get("properties", {}), set(schema.get("required", ()))
    keys = {key for key, _ in params}
    if not required <= keys or not keys <= set(properties):
        return None
    typed = {}
    for key, raw in params:
        value = _typed_value(raw, properties[key])
        if value is None:
            return None
        typed[key] = value
    return typed


def _typed_value(raw: str, schema: dict) -> Any:
    kind = schema.get("type")
    if kind == "string":
        value = raw if raw.strip() else None
    elif kind in ("number", "integer"):
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "integer" and not isinstance(value, int)):
            return None
    else:
        return None
    if "enum" in schema and value not in schema["enum"]:
        return None
    return value


@dataclass(frozen=True)
class EvalItem:
    """One prompt (messages ending before a target) and what a correct completion holds."""

    kind: str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    expected: str | ToolCall


def eval_items(conversations: list[Conversation]) -> list[EvalItem]:
    """Tool conversations give two items (`KIND/call` and `KIND/answer`); others one."""
    items = []
    for conversation in conversations:
        messages = conversation.messages
        for index in conversation.target_indices:
            target = messages[index]
            if target.get("tool_calls"):
                function = target["tool_calls"][0]["function"]
                expected = ToolCall(function["name"], tuple(function["arguments"].items()))
                items.append(EvalItem(conversation.kind + "/call", messages[:index], conversation.tools, expected))
            else:
                kind = conversation.kind + ("/answer" if len(conversation.target_indices) > 1 else "")
                items.append(EvalItem(kind, messages[:index], conversation.tools, conversation.result))
    return items


def is_correct(item: EvalItem, parsed: ParsedOutput) -> bool:
    if isinstance(item.expected, ToolCall):
        arguments = typed_arguments(parsed.call, list(item.tools or ())) if parsed.call else None
        return arguments is not None and parsed.call[0] == item.expected.name and arguments == dict(item.expected.arguments)
    if parsed.content is None:
        return False
    if item.kind in ARITHMETIC_KINDS or item.kind in ("metric", "clock"):
        numbers = re.findall(r"= (-?[0-9.]+)", parsed.content)
        return bool(numbers) and numbers[-1].rstrip(".") == item.expected
    return parsed.content == item.expected


def is_valid_call(item: EvalItem, parsed: ParsedOutput) -> bool:
    """The right tool with schema-valid arguments (values may still differ from the expected)."""
    assert isinstance(item.expected, ToolCall)
    return parsed.call is not None and parsed.call[0] == item.expected.name and (
        typed_arguments(parsed.call, list(item.tools or ())) is not None
    )


ARITHMETIC_GROUP = "ARITHMETIC exact answer"
VALID_CALL_GROUP = "TOOL CALL valid (right tool, schema-valid args)"
EXACT_CALL_GROUP = "TOOL CALL exact arguments"
THINK_GROUP = "THINK well-formed (answer turns)"


def score(items: list[EvalItem], completions: list[str]) -> dict[str, float]:
    """Accuracy per kind plus the headline groups (upper case) the issue asks for."""
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for item, text in zip(items, completions, strict=True):
        parsed = parse_output(text)
        correct = is_correct(item, parsed)
        outcomes[item.kind].append(correct)
        if item.kind in ARITHMETIC_KINDS:
            outcomes[ARITHMETIC_GROUP].append(correct)
        if isinstance(item.expected, ToolCall):
            outcomes[VALID_CALL_GROUP].append(is_valid_call(item, parsed))
            outcomes[EXACT_CALL_GROUP].append(correct)
        else:
            outcomes[THINK_GROUP].append(parsed.content is not None)
    return {group: sum(values) / len(values) for group, values in sorted(outcomes.items())}


@torch.no_grad()
def greedy_completions(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 32) -> list[str]:
    """Greedy decoding of rendered prompts in length-sorted, left-padded batches; each completion
    is decoded with special tokens and cut after the first EOS."""
    eos_id, pad_id = tokenizer.token_to_id(EOS), tokenizer.token_to_id("<|pad|>")
    encoded = [tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    results: list[str] = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in batch)
        ids = torch.tensor([[pad_id] * (width - len(encoded[i])) + encoded[i] for i in batch])
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(encoded[i]) for i in batch])[:, None]).long()
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos_id, pad_token_id=pad_id,
        )
        for row, index in zip(out[:, width:].tolist(), batch):
            if eos_id in row:
                row = row[: row.index(eos_id) + 1]
            results[index] = tokenizer.decode(row, skip_special_tokens=False)
    return results

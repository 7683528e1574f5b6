"""Conversation records the default-model data generators produce and the renderer consumes.

A `Conversation` holds OpenAI-format message dicts (never mutated after construction) plus the
indices of the assistant messages the model is trained to produce. Target answers carry their
reasoning in `reasoning_content`; assistant messages that only stand in the history (plain answers
of an earlier turn, as an OpenAI client sends them back) carry none and are not targets. Tool-call
turns carry no reasoning, so they render identically as a target and as history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Conversation:
    """One synthetic chat: `kind` names the task family (for example "add" or "tool_weather");
    `result` is what a checker compares the final answer with (a number, a copied text, a JSON
    document, or the final sentence after a tool result)."""

    kind: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    target_indices: tuple[int, ...]
    result: str

    def __post_init__(self) -> None:
        for index in self.target_indices:
            if self.messages[index]["role"] != "assistant":
                raise ValueError(f"target {index} of a {self.kind} conversation is not an assistant message")

    @property
    def first_user_text(self) -> str:
        """The first user message, the key used to keep held-out prompts out of training."""
        return next(m["content"] for m in self.messages if m["role"] == "user")


@dataclass(frozen=True)
class ToolCall:
    """One expected tool call: the function name and its arguments in declaration order."""

    name: str
    arguments: tuple[tuple[str, Any], ...]

    def as_message_call(self, call_id: str) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry, arguments as a mapping (what the template renders)."""
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def answer(text: str, reasoning: str | None = None) -> dict[str, Any]:
    """An assistant answer; with `reasoning`, a training target rendered inside <think>."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def tool_call_message(call: ToolCall, call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call.as_message_call(call_id)]}


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}

"""Rendering conversations through the shipped chat template, and tokenizing them with loss masks.

The training text is produced by the very template that ships with the model (compiled in a jinja2
sandbox with transformers' settings), so what the model learns is exactly what a serving frontend
renders. Trained spans are found by rendering prefixes: the text between the generation prompt
before a target assistant message and that message's `<|im_end|>` is what the model must produce.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from default_model_conversation import Conversation
from default_model_tokenizer import EOS_TOKEN, MAX_LENGTH

TEMPLATE_PATH = Path(__file__).resolve().parent / "default_chat_template.jinja"


def load_template_text() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def _tojson(value, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson: insertion order, no HTML escaping, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


@dataclass(frozen=True)
class Example:
    """A tokenized conversation: `ids` and, per id, whether the loss is taken on it."""

    kind: str
    ids: tuple[int, ...]
    trained: tuple[bool, ...]


class ChatRenderer:
    """Renders message lists with one compiled template; holds no per-call state."""

    def __init__(self, template_text: str) -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.filters["tojson"] = _tojson
        self._template = environment.from_string(template_text)

    def render(self, messages, tools=None, add_generation_prompt: bool = False) -> str:
        return self._template.render(
            messages=list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt
        )

    def pieces(self, conversation: Conversation) -> list[tuple[str, bool]]:
        """The full rendering cut into (text, trained) pieces; trained pieces end with EOS."""
        messages, tools = conversation.messages, conversation.tools
        full = self.render(messages, tools)
        pieces, cursor = [], 0
        for index in conversation.target_indices:
            start = len(self.render(messages[:index], tools, add_generation_prompt=True))
            through = self.render(messages[: index + 1], tools)
            end = through.rindex(EOS_TOKEN) + len(EOS_TOKEN)
            if not full.startswith(through) or start < cursor:
                raise ValueError(f"template is not incremental for a {conversation.kind} conversation")
            pieces += [(full[cursor:start], False), (full[start:end], True)]
            cursor = end
        pieces.append((full[cursor:], False))
        return [(text, trained) for text, trained in pieces if text]


def encode_conversations(renderer: ChatRenderer, tokenizer: Tokenizer, conversations: list[Conversation]) -> list[Example]:
    """Tokenize every conversation piece by piece; each piece boundary sits at a special token, so
    the concatenation equals the tokenization of the whole text (checked). Conversations longer
    than the context (`MAX_LENGTH` tokens) are left out."""
    all_pieces = [renderer.pieces(c) for c in conversations]
    flat = [text for pieces in all_pieces for text, _ in pieces]
    encoded = iter(tokenizer.encode_batch(flat, add_special_tokens=False))
    wholes = tokenizer.encode_batch(["".join(t for t, _ in pieces) for pieces in all_pieces], add_special_tokens=False)
    examples = []
    for conversation, pieces, whole in zip(conversations, all_pieces, wholes):
        ids: list[int] = []
        trained: list[bool] = []
        for _, is_trained in pieces:
            piece_ids = next(encoded).ids
            ids += piece_ids
            trained += [is_trained] * len(piece_ids)
        if ids != whole.ids:
            raise ValueError(f"piecewise tokenization differs for a {conversation.kind} conversation")
        if len(ids) <= MAX_LENGTH:
            examples.append(Example(conversation.kind, tuple(ids), tuple(trained)))
    return examples

"""Frontend assets of a checkpoint directory: tokenizer, chat template, EOS ids, syntax choices.

Read once at preparation; the runtime never reads checkpoint files. What a checkpoint says about
its frontend (special tokens, template, EOS) becomes typed contract data here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.preparation.contract import FrontendDeclaration

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
# Message envelopes recognised from a tokenizer's special tokens: (start, end, assistant header).
ENVELOPES = (
    ("<|im_start|>", "<|im_end|>", "assistant\n"),
    ("<|start_header_id|>", "<|eot_id|>", "assistant<|end_header_id|>\n\n"),
)


@dataclass(frozen=True)
class CheckpointAssets:
    """Tokenizer bytes, chat template source and the frontend facts derived from them."""

    tokenizer_json: bytes
    chat_template: str
    eos_token_ids: tuple[int, ...]
    template_tokens: tuple[spb.TemplateToken, ...]
    frontend: FrontendDeclaration
    digest: str

    @property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_str(self.tokenizer_json.decode("utf-8"))


def read_assets(directory: Path, vocab_size: int) -> CheckpointAssets:
    """Reads tokenizer.json, tokenizer_config.json (chat template, special tokens) and EOS ids."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no tokenizer.json")
    tokenizer_json = path.read_bytes()
    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    config = _read_json(directory / "tokenizer_config.json")
    template = _chat_template(directory, config)
    tokens = _template_tokens(tokenizer, config, vocab_size)
    eos = _eos_ids(directory, tokenizer, config, vocab_size)
    digest = hashlib.sha256(tokenizer_json + template.encode("utf-8")).hexdigest()
    return CheckpointAssets(tokenizer_json, template, eos, tokens, _frontend(tokenizer), digest)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from error
    return value if isinstance(value, dict) else {}


def _chat_template(directory: Path, config: dict) -> str:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise CheckpointError(f"{directory} declares no chat template (tokenizer_config.json or chat_template.jinja)")
    return template


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _template_tokens(tokenizer: Tokenizer, config: dict, vocab_size: int) -> tuple[spb.TemplateToken, ...]:
    tokens = []
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        text = _token_text(config.get(name))
        token_id = tokenizer.token_to_id(text) if text else None
        if token_id is not None and token_id < vocab_size:
            tokens.append(spb.TemplateToken(name=name, text=text, token_id=token_id))
    return tuple(tokens)


def _eos_ids(directory: Path, tokenizer: Tokenizer, config: dict, vocab_size: int) -> tuple[int, ...]:
    ids: list[int] = []
    generation = _read_json(directory / "generation_config.json").get("eos_token_id")
    for value in generation if isinstance(generation, list) else [generation]:
        if isinstance(value, int):
            ids.append(value)
    text = _token_text(config.get("eos_token"))
    if text and tokenizer.token_to_id(text) is not None:
        ids.append(tokenizer.token_to_id(text))
    unique = tuple(dict.fromkeys(i for i in ids if 0 <= i < vocab_size))
    if not unique:
        raise CheckpointError(f"{directory} declares no EOS token inside the vocabulary")
    return unique


def _frontend(tokenizer: Tokenizer) -> FrontendDeclaration:
    """Think-tag reasoning and function-tag tools when the tokenizer has those special tokens."""
    think_open, think_close = tokenizer.token_to_id(THINK_OPEN), tokenizer.token_to_id(THINK_CLOSE)
    has_tools = tokenizer.token_to_id(TOOL_OPEN) is not None and tokenizer.token_to_id(TOOL_CLOSE) is not None
    tool_parser, tool_syntax = spb.TOOL_PARSER_NONE, None
    if has_tools:
        tool_parser = spb.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS
        tool_syntax = spb.ToolSyntax(
            opener=TOOL_OPEN, closer=TOOL_CLOSE, tag_separator="\n", wrapping_newlines=1,
            invoke_open="<function=", invoke_close="</function>", parameter_open="<parameter=",
            parameter_close="</parameter>", name_end=">",
        )
    reasoning_parser, reasoning_syntax = spb.REASONING_PARSER_NONE, None
    if think_open is not None and think_close is not None:
        reasoning_parser = spb.REASONING_PARSER_THINK_TAGS
        reasoning_syntax = spb.ReasoningSyntax(
            open=THINK_OPEN, close=THINK_CLOSE, open_token_id=think_open, close_token_id=think_close,
            terminal_markers=[TOOL_OPEN] if has_tools else [], wrapping_newlines=1,
        )
    return FrontendDeclaration(tool_parser, reasoning_parser, tool_syntax, reasoning_syntax, _boundary(tokenizer))


def _boundary(tokenizer: Tokenizer) -> spb.AssistantBoundary:
    for start, end, header in ENVELOPES:
        if tokenizer.token_to_id(start) is not None and tokenizer.token_to_id(end) is not None:
            return spb.AssistantBoundary(message_start=start, message_end=end, assistant_header=header)
    raise CheckpointError(
        "the tokenizer has no recognised chat message envelope; supported: "
        + ", ".join(f"{start}...{end}" for start, end, _ in ENVELOPES)
    )

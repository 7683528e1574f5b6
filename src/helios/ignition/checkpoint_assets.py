"""Frontend assets of a checkpoint directory: tokenizer, chat template, EOS ids, syntax declarations.

Read once at preparation; the runtime never reads checkpoint files. What a checkpoint says about
its frontend (special tokens, template, EOS) becomes typed contract data here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tokenizers import Tokenizer

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.frontend.families import select_family
from helios.ignition.frontend.probes import message_boundary, prefix_rules, reasoning_facts, tool_call_text
from helios.ignition.frontend.render import ProbeTemplate
from helios.ignition.preparation.contract import FrontendDeclaration

# Keys of `--frontend KEY=VALUE`: what a publisher may state instead of what the probes derive.
STATED_KEYS = ("family", "reasoning", "message_start", "assistant_header", "message_end")


@dataclass(frozen=True)
class CheckpointAssets:
    """Tokenizer bytes, chat template source and the frontend facts derived from them."""

    tokenizer_json: bytes
    chat_template: str
    eos_token_ids: tuple[int, ...]
    template_tokens: tuple[spb.TemplateToken, ...]
    frontend: FrontendDeclaration
    digest: str
    sampling: spb.SamplingDefaults | None = None  # generation_config recommendations (see export)

    @property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_str(self.tokenizer_json.decode("utf-8"))


def read_assets(directory: Path, vocab_size: int, stated: Mapping[str, str] | None = None) -> CheckpointAssets:
    """Reads tokenizer.json, tokenizer_config.json (chat template, special tokens) and EOS ids, and
    derives the frontend declaration from the template (`stated` values win; see STATED_KEYS)."""
    stated = dict(stated or {})
    unknown = set(stated) - set(STATED_KEYS)
    if unknown:
        raise CheckpointError(f"unknown frontend keys {sorted(unknown)}; known: {', '.join(STATED_KEYS)}")
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no tokenizer.json")
    tokenizer_json = path.read_bytes()
    try:
        tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    except Exception as error:  # tokenizers raises a bare Exception for a malformed file
        raise CheckpointError(f"cannot read {path}: {error}") from None
    # Plain text can encode to any token of the tokenizer's model; one past the embedding would fail on
    # the device. (Added tokens past it may be input-only ids a layout replaces; they are kept.)
    if tokenizer.get_vocab_size(with_added_tokens=False) > vocab_size:
        raise CheckpointError(f"{path} holds {tokenizer.get_vocab_size(with_added_tokens=False)} tokens, more than "
                              f"the model's vocab_size {vocab_size}: the excess ids have no embedding")
    config = _read_json(directory / "tokenizer_config.json")
    template = _chat_template(directory, config)
    tokens = _template_tokens(tokenizer, config, vocab_size)
    eos = _eos_ids(directory, tokenizer, config, vocab_size)
    digest = hashlib.sha256(tokenizer_json + template.encode("utf-8")).hexdigest()
    frontend = _frontend(template, tokenizer, _read_json(directory / "config.json"), stated, tokens)
    return CheckpointAssets(tokenizer_json, template, eos, tokens, frontend, digest)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    return value if isinstance(value, dict) else {}


def _chat_template(directory: Path, config: dict) -> str:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except ValueError as error:
            raise CheckpointError(f"cannot read {jinja}: {error}") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {entry.get("name"): entry.get("template") for entry in template
                 if isinstance(entry, dict) and isinstance(entry.get("name"), str)}
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
        if isinstance(value, int) and not isinstance(value, bool):
            ids.append(value)
    text = _token_text(config.get("eos_token"))
    if text and tokenizer.token_to_id(text) is not None:
        ids.append(tokenizer.token_to_id(text))
    unique = tuple(dict.fromkeys(i for i in ids if 0 <= i < vocab_size))
    if not unique:
        raise CheckpointError(f"{directory} declares no EOS token inside the vocabulary")
    return unique


def _frontend(template: str, tokenizer: Tokenizer, config: dict, stated: Mapping[str, str],
              tokens: tuple[spb.TemplateToken, ...]) -> FrontendDeclaration:
    """Boundaries, reasoning and tool syntax from probe renders of the template (see ignition.frontend)."""
    probe = ProbeTemplate(template, {t.name: t.text for t in tokens})
    boundary = message_boundary(probe, tokenizer, stated)
    rendered_call = tool_call_text(probe)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else ""
    family = select_family(rendered_call, model_type, stated.get("family"))
    if family is not None and family.channel_syntax is not None:
        _check_channel_controls(family.channel_syntax, tokenizer, stated)
        reasoning_parser, reasoning_syntax = spb.REASONING_PARSER_HARMONY_CHANNELS, None
        tool_parser, tool_syntax = family.tool_parser, None
    else:
        tool_parser, tool_syntax, reasoning_parser, reasoning_syntax = _tags_frontend(
            probe, tokenizer, boundary, family, stated)
    rules = prefix_rules(probe, family is not None)
    assistant = spb.AssistantBoundary(message_start=boundary.message_start, message_end=boundary.message_end,
                                      assistant_header=boundary.assistant_header)
    return FrontendDeclaration(tool_parser, reasoning_parser, tool_syntax, reasoning_syntax, assistant,
                               tuple(rules), family.name if family is not None else "none",
                               family.channel_syntax if family is not None else None)


def _check_channel_controls(channels: spb.ChannelSyntax, tokenizer: Tokenizer, stated: Mapping[str, str]) -> None:
    """Harmony frames delimit only at single control tokens, and carry reasoning structurally."""
    if stated.get("reasoning") == "none":
        raise CheckpointError("harmony frames carry reasoning on their own channels: reasoning=none does not apply; "
                              "state --frontend family=none to serve without the frame parsers")
    for field in ("start_control", "channel_control", "message_control", "end_control", "call_control",
                  "return_control", "constrain_control"):
        text = getattr(channels, field)
        if len(tokenizer.encode(text, add_special_tokens=False).ids) != 1:
            raise CheckpointError(f"the template renders harmony frames, but the tokenizer has no single token "
                                  f"for the {field.replace('_', ' ')} {text!r}")


def _tags_frontend(probe: ProbeTemplate, tokenizer: Tokenizer, boundary, family, stated: Mapping[str, str]):
    """Tool and reasoning selectors and syntax of the delimiter families (think tags probed)."""
    tool_parser, tool_syntax = spb.TOOL_PARSER_NONE, None
    if family is not None:
        tool_parser, tool_syntax = family.tool_parser, family.tool_syntax
    reasoning_parser, reasoning_syntax = spb.REASONING_PARSER_NONE, None
    facts = None if stated.get("reasoning") == "none" else reasoning_facts(probe, boundary.generation_prompt)
    if facts is not None:
        reasoning_parser = spb.REASONING_PARSER_THINK_TAGS
        if family is not None and family.tool_parser == spb.TOOL_PARSER_XTML:
            reasoning_parser = spb.REASONING_PARSER_XTML_THINK
        terminal = [tool_syntax.opener] if family is not None and family.reasoning_ends_at_tools else []
        reasoning_syntax = spb.ReasoningSyntax(
            open=facts.open, close=facts.close, terminal_markers=terminal,
            wrapping_newlines=facts.wrapping_newlines, after_close=facts.after_close,
        )
        for field, text in (("open_token_id", facts.open), ("close_token_id", facts.close)):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) == 1:
                setattr(reasoning_syntax, field, ids[0])
    return tool_parser, tool_syntax, reasoning_parser, reasoning_syntax

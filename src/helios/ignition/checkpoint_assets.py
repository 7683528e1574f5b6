"""Frontend assets of a checkpoint directory: tokenizer, chat template, EOS ids, syntax declarations.

Read once at preparation; the runtime never reads checkpoint files. What a checkpoint says about
its frontend (special tokens, template, EOS) becomes typed contract data here.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tokenizers import Tokenizer

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_links import check_links
from helios.ignition.frontend.families import select_family
from helios.ignition.frontend.probes import (
    message_boundary, prefix_rules, reasoning_facts, tool_call_id_len, tool_call_text)
from helios.ignition.frontend.render import ProbeTemplate
from helios.ignition.frontend.tokenizer_files import (
    chat_template, check_encodes, cleans_up_spaces, declared_added_tokens, eos_token_ids, missing_tokenizer_json, parsed_tokenizer,
    read_bounded, read_json, served_tokenizer, special_tokens, template_tokens)
from helios.ignition.preparation.contract import FrontendDeclaration

# Keys of `--frontend KEY=VALUE`: what a publisher may state instead of what the probes derive.
STATED_KEYS = ("family", "reasoning", "message_start", "assistant_header", "message_end")
# The largest published tokenizer.json files (256k-token vocabularies with their merges) are tens of
# megabytes; a larger one is damaged or sparse, refused before it is read whole and parsed.
MAX_TOKENIZER_NBYTES = 256 << 20


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
    check_links(directory)  # also where a checkpoint's assets are read without its weights
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(missing_tokenizer_json(directory))
    tokenizer_json, tokenizer = served_tokenizer(*_read_tokenizer(path), path)
    # Plain text can encode to any token of the tokenizer's model; one past the embedding would fail on
    # the device. (Added tokens past it may be input-only ids a layout replaces; they are kept.)
    if tokenizer.get_vocab_size(with_added_tokens=False) > vocab_size:
        raise CheckpointError(f"{path} holds {tokenizer.get_vocab_size(with_added_tokens=False)} tokens, more than "
                              f"the model's vocab_size {vocab_size}: the excess ids have no embedding")
    # The count is no bound on the ids: a vocabulary with gaps ({"a": 0, "b": 100000}) counts 2.
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    past = max(vocab.items(), key=lambda item: item[1], default=("", -1))
    if past[1] >= vocab_size:
        raise CheckpointError(f"{path} gives the token {past[0]!r} the id {past[1]}, past the model's vocab_size "
                              f"{vocab_size}: it has no embedding")
    config = read_json(directory / "tokenizer_config.json")
    tokenizer_json, tokenizer = declared_added_tokens(tokenizer_json, tokenizer, config)
    check_encodes(tokenizer, path, vocab_size)
    template = chat_template(directory, config)
    named = special_tokens(directory, config)
    tokens = template_tokens(tokenizer, named, vocab_size)
    eos = eos_token_ids(directory, tokenizer, named, vocab_size)
    digest = hashlib.sha256(tokenizer_json + template.encode("utf-8")).hexdigest()
    frontend = _frontend(template, tokenizer, read_json(directory / "config.json"), stated, tokens)
    frontend = dataclasses.replace(frontend, clean_up_tokenization_spaces=cleans_up_spaces(tokenizer, config))
    return CheckpointAssets(tokenizer_json, template, eos, tokens, frontend, digest)


def _read_tokenizer(path: Path) -> tuple[bytes, Tokenizer]:
    try:
        tokenizer_json = read_bounded(path, MAX_TOKENIZER_NBYTES)
    except OSError as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    try:
        text = tokenizer_json.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    return tokenizer_json, parsed_tokenizer(text, f"cannot read {path}")


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
                               family.channel_syntax if family is not None else None,
                               tool_call_id_len(probe) if family is not None else 0)


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

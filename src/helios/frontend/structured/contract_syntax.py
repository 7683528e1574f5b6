"""The contract's frontend section mapped to the frontend's typed syntax records.

`FrontendSyntax.from_contract(frontend, encode)` reads a validated `serving_pb2.FrontendContract`
and the frontend tokenizer's ``encode`` (text -> ids, no special prefix tokens) and builds, once
per served model:

- `output`: the parsers' `OutputSyntax`. The two parser enums select the syntax families; every
  spelling comes from the contract's syntax data (`ToolSyntax`, `ReasoningSyntax`,
  `AssistantBoundary`). `TOOL_FIELDS` lists which `ToolSyntax` fields each family reads: a family's
  required spelling that is empty, or a field it does not read that is set, is a `ContractError`,
  so no declared data is silently ignored;
- `delimiters`: the single-token delimiters (`TokenDelimiters`). Reasoning delimiter ids the
  contract declares must be what the tokenizer produces, and a delimiter the tokenizer encodes as
  one token must be declared (an inconsistent contract fails startup, not a request);
- `prompt_rules`: the prompt path's `PromptRules` (message boundaries, reasoning markup, prefix rules);
- `envelope(state)`: the grammar's `ReasoningEnvelope` for a prompt's initial reasoning state;
- `output_start(prompt)`: the parsers' initial state (`OutputStart`), including where a
  recipient-header output starts (`frame_start`).

Nothing here is keyed by model identity. A `FrontendSyntax` is immutable and shared by every
request of the model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from helios.contract import serving_pb2 as spb
from helios.errors import ContractError
from helios.frontend.structured.grammar import ReasoningEnvelope
from helios.frontend.parsers import FramePosition, FrameStart, OutputStart, TokenDelimiters
from helios.frontend.parsers.start import pending_answer_lead
from helios.frontend.preparation.prompt import Prompt, PromptRules, ReasoningState
from helios.frontend.decoding.syntax import (
    ChannelSyntax,
    ElementToolSyntax,
    GlmArgumentSyntax,
    JsonCallSyntax,
    OutputSyntax,
    QwenCoderSyntax,
    ReasoningSyntaxKind,
    RecipientSyntax,
    ThinkSyntax,
    ToolSyntaxKind,
)

FRONTEND = "contract.model.frontend"
Encode = Callable[[str], Sequence[int]]

TOOL_KINDS = {
    spb.TOOL_PARSER_NONE: ToolSyntaxKind.NONE,
    spb.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS: ToolSyntaxKind.QWEN_CODER_FUNCTIONS,
    spb.TOOL_PARSER_GLM_ARGUMENT_TAGS: ToolSyntaxKind.GLM_ARGUMENTS,
    spb.TOOL_PARSER_DSML: ToolSyntaxKind.DSML,
    spb.TOOL_PARSER_XTML: ToolSyntaxKind.XTML,
    spb.TOOL_PARSER_ATEM_RECIPIENT: ToolSyntaxKind.ATEM_RECIPIENTS,
    spb.TOOL_PARSER_JSON_CALLS: ToolSyntaxKind.JSON_CALLS,
    spb.TOOL_PARSER_HARMONY_CHANNELS: ToolSyntaxKind.HARMONY_CHANNELS,
}
REASONING_KINDS = {
    spb.REASONING_PARSER_NONE: ReasoningSyntaxKind.NONE,
    spb.REASONING_PARSER_THINK_TAGS: ReasoningSyntaxKind.THINK_TAGS,
    spb.REASONING_PARSER_XTML_THINK: ReasoningSyntaxKind.XTML_THINK,
    spb.REASONING_PARSER_RECIPIENT_HEADER: ReasoningSyntaxKind.RECIPIENT_HEADERS,
    spb.REASONING_PARSER_HARMONY_CHANNELS: ReasoningSyntaxKind.HARMONY_CHANNELS,
}

_ELEMENT = ("opener", "closer", "invoke_open", "invoke_close", "parameter_open", "parameter_close", "name_end")


@dataclass(frozen=True)
class FieldUse:
    """ToolSyntax fields a family reads: `required` must be set, `optional` may be."""

    required: frozenset[str]
    optional: frozenset[str] = frozenset()


def _use(required: Sequence[str], optional: Sequence[str] = ()) -> FieldUse:
    return FieldUse(frozenset(required), frozenset(optional))


TOOL_FIELDS = {
    ToolSyntaxKind.QWEN_CODER_FUNCTIONS: _use(_ELEMENT, ("tag_separator", "wrapping_newlines", "block_lead")),
    ToolSyntaxKind.GLM_ARGUMENTS: _use(
        ("opener", "closer", "tag_separator", "parameter_open", "name_end", "value_open", "parameter_close"),
        ("block_lead",),
    ),
    ToolSyntaxKind.DSML: _use(
        (*_ELEMENT, "string_attribute", "string_true", "string_false"), ("tag_separator", "block_lead")
    ),
    ToolSyntaxKind.XTML: _use(_ELEMENT, ("tag_separator", "block_lead")),
    ToolSyntaxKind.ATEM_RECIPIENTS: _use(_ELEMENT, ("tag_separator",)),
    ToolSyntaxKind.JSON_CALLS: _use((), (
        "opener", "closer", "name_key", "arguments_key", "invoke_open", "name_end", "arguments_open",
        "arguments_close", "invoke_close", "block_lead",
    )),
}


def check_tool_fields(kind: ToolSyntaxKind, tools: spb.ToolSyntax) -> None:
    """ContractError unless exactly the fields `kind` reads carry data (required ones non-empty)."""
    use = TOOL_FIELDS[kind]
    for field in spb.ToolSyntax.DESCRIPTOR.fields:
        is_set = bool(getattr(tools, field.name))
        path = f"{FRONTEND}.tool_syntax.{field.name}"
        if field.name in use.required and not is_set:
            raise ContractError(path, f"the {kind.name} tool syntax needs this spelling")
        if is_set and field.name not in use.required | use.optional:
            raise ContractError(path, f"the {kind.name} tool syntax does not use this field")


def tool_syntax(kind: ToolSyntaxKind, tools: spb.ToolSyntax):
    """The parsers' tool syntax record of a tag family (None for NONE; ATEM: see recipient_syntax)."""
    if kind in (ToolSyntaxKind.NONE, ToolSyntaxKind.ATEM_RECIPIENTS, ToolSyntaxKind.HARMONY_CHANNELS):
        return None
    check_tool_fields(kind, tools)
    if kind is ToolSyntaxKind.QWEN_CODER_FUNCTIONS:
        return QwenCoderSyntax(
            tools.opener, tools.closer, tools.invoke_open, tools.invoke_close, tools.parameter_open,
            tools.parameter_close, tools.name_end, value_wrap="\n" * tools.wrapping_newlines,
            block_lead=tools.block_lead,
        )
    if kind is ToolSyntaxKind.JSON_CALLS:
        return JsonCallSyntax(
            tools.opener, tools.closer, tools.name_key, tools.arguments_key, tools.invoke_open, tools.name_end,
            tools.arguments_open, tools.arguments_close, tools.invoke_close, tools.block_lead,
        )
    if kind is ToolSyntaxKind.GLM_ARGUMENTS:
        return GlmArgumentSyntax(
            tools.opener, tools.closer, tools.tag_separator, tools.parameter_open, tools.name_end,
            tools.value_open, tools.parameter_close, block_lead=tools.block_lead,
        )
    return element_syntax(tools)


def element_syntax(tools: spb.ToolSyntax) -> ElementToolSyntax:
    """DSML, XTML and ATEM markup (string flags only where the contract declares them)."""
    flags = {}
    if tools.string_attribute:
        flags = dict(string_attribute=tools.string_attribute, string_true=tools.string_true,
                     string_false=tools.string_false)
    return ElementToolSyntax(
        tools.opener, tools.closer, tools.invoke_open, tools.invoke_close, tools.parameter_open,
        tools.parameter_close, tools.name_end, block_lead=tools.block_lead, **flags,
    )


def think_syntax(reasoning: spb.ReasoningSyntax) -> ThinkSyntax:
    """Tag reasoning: wrapping newlines on both inner sides, ``after_close`` before the answer.

    Every terminal marker equals the tool opener (contract rule), so the first one is the marker.
    """
    wrap = "\n" * reasoning.wrapping_newlines
    terminal = reasoning.terminal_markers[0] if reasoning.terminal_markers else ""
    return ThinkSyntax(reasoning.open, reasoning.close, wrap, wrap, reasoning.after_close, terminal)


def recipient_syntax(frontend: spb.FrontendContract) -> RecipientSyntax:
    """Recipient-header frames: header controls from the assistant boundary, ATEM call markup."""
    boundary = frontend.assistant_boundary
    if not boundary.message_start:
        raise ContractError(f"{FRONTEND}.assistant_boundary.message_start", "recipient frames need a start control")
    check_tool_fields(ToolSyntaxKind.ATEM_RECIPIENTS, frontend.tool_syntax)
    return RecipientSyntax(
        start_control=boundary.message_start,
        message_control=boundary.header_end,
        end_message_control=boundary.internal_message_end,
        role=boundary.assistant_header,
        recipient_prefix=boundary.recipient_prefix,
        reasoning_recipient=boundary.self_recipient,
        content_recipients=tuple(boundary.visible_recipients),
        generic_tool_recipient=boundary.generic_tool_recipient,
        named_tool_prefix=boundary.named_tool_prefix,
        tools=element_syntax(frontend.tool_syntax),
    )


def channel_syntax(frontend: spb.FrontendContract) -> ChannelSyntax:
    """Harmony channel frames: every spelling from the contract's channel syntax."""
    c = frontend.channel_syntax
    return ChannelSyntax(
        c.start_control, c.channel_control, c.message_control, c.end_control, c.call_control, c.return_control,
        c.constrain_control, c.role, c.recipient_marker, tuple(c.reasoning_channels), tuple(c.content_channels),
        c.tool_namespace, c.final_channel, c.tool_channel, c.tool_content_type,
    )


def output_syntax(frontend: spb.FrontendContract) -> OutputSyntax:
    """The parsers' syntax; the pairing rules were checked by the contract validators."""
    reasoning_kind = REASONING_KINDS[frontend.reasoning_parser]
    tool_kind = TOOL_KINDS[frontend.tool_parser]
    _check_boundary_fields(frontend, reasoning_kind)
    if reasoning_kind is ReasoningSyntaxKind.RECIPIENT_HEADERS:
        return OutputSyntax(reasoning_kind, tool_kind, frames=recipient_syntax(frontend))
    if reasoning_kind is ReasoningSyntaxKind.HARMONY_CHANNELS:
        return OutputSyntax(reasoning_kind, tool_kind, channels=channel_syntax(frontend))
    think = None
    if reasoning_kind in (ReasoningSyntaxKind.THINK_TAGS, ReasoningSyntaxKind.XTML_THINK):
        think = think_syntax(frontend.reasoning_syntax)
    tools = tool_syntax(tool_kind, frontend.tool_syntax)
    return OutputSyntax(reasoning_kind, tool_kind, think=think, tools=tools)


def _check_boundary_fields(frontend: spb.FrontendContract, reasoning_kind: ReasoningSyntaxKind) -> None:
    boundary = frontend.assistant_boundary
    path = f"{FRONTEND}.assistant_boundary"
    if boundary.named_tool_prefix and reasoning_kind is not ReasoningSyntaxKind.RECIPIENT_HEADERS:
        raise ContractError(f"{path}.named_tool_prefix", "only recipient-header frames name tool recipients")
    for i, marker in enumerate(boundary.embedded_message_ends):
        if not marker:
            raise ContractError(f"{path}.embedded_message_ends[{i}]", "message end markers must be non-empty")


def token_delimiters(syntax: OutputSyntax, frontend: spb.FrontendContract, encode: Encode) -> TokenDelimiters:
    """Single-token delimiters, cross-checked against the contract: declared reasoning token ids must
    be the tokenizer's, and recipient-header controls must be single tokens."""
    encoded = {spelling: tuple(encode(spelling)) for spelling in syntax.delimiter_spellings()}
    ids = {spelling: token_ids[0] for spelling, token_ids in encoded.items() if len(token_ids) == 1}
    if syntax.think is not None:
        reasoning = frontend.reasoning_syntax
        for spelling, field in ((reasoning.open, "open_token_id"), (reasoning.close, "close_token_id")):
            declared = getattr(reasoning, field) if reasoning.HasField(field) else None
            if declared != ids.get(spelling):
                raise ContractError(
                    f"{FRONTEND}.reasoning_syntax.{field}",
                    f"declares {declared} but the tokenizer encodes {spelling!r} as {list(encoded[spelling])}",
                )
    if syntax.frames is not None:
        boundary = frontend.assistant_boundary
        for field in ("message_start", "header_end", "internal_message_end"):
            spelling = getattr(boundary, field)
            if spelling not in ids:
                raise ContractError(
                    f"{FRONTEND}.assistant_boundary.{field}",
                    f"header control {spelling!r} is not one tokenizer token: {list(encoded[spelling])}",
                )
    if syntax.channels is not None:
        for spelling in syntax.channels.controls:
            if spelling not in ids:
                raise ContractError(f"{FRONTEND}.channel_syntax",
                                    f"control {spelling!r} is not one tokenizer token: {list(encoded[spelling])}")
    try:
        return TokenDelimiters(ids)
    except ValueError:
        raise ContractError(f"{FRONTEND}", f"two delimiters are one tokenizer token: {ids}") from None


@dataclass(frozen=True)
class FrontendSyntax:
    """Everything the prompt path, the parsers and the grammar need from the contract's frontend."""

    output: OutputSyntax
    delimiters: TokenDelimiters
    prompt_rules: PromptRules
    message_ends: tuple[str, ...]
    reasoning_envelope: ReasoningEnvelope | None  # state UNOPENED; `envelope()` sets the real one

    @classmethod
    def from_contract(cls, frontend: spb.FrontendContract, encode: Encode) -> FrontendSyntax:
        output = output_syntax(frontend)
        delimiters = token_delimiters(output, frontend, encode)
        rules = PromptRules.from_contract(frontend)
        envelope = None
        if output.think is not None:
            envelope = ReasoningEnvelope.from_contract(
                frontend.reasoning_syntax, ReasoningState.UNOPENED, frontend.reasoning_syntax.after_close
            )
        return cls(output, delimiters, rules, rules.message_ends, envelope)

    @property
    def has_frames(self) -> bool:
        """Recipient-header output: structured output cannot wrap it in a reasoning envelope."""
        return self.output.frames is not None

    def envelope(self, state: ReasoningState) -> ReasoningEnvelope | None:
        """The grammar envelope for a prompt's initial reasoning state (None without tag reasoning)."""
        if self.reasoning_envelope is None:
            return None
        return replace(self.reasoning_envelope, state=state)

    @property
    def has_channels(self) -> bool:
        """Harmony channel output (its own frame grammar, like recipient frames)."""
        return self.output.channels is not None

    def output_start(self, prompt: Prompt) -> OutputStart:
        """The parsers' initial state. Controls are read in the prompt's `control_text`: a client's
        literal ``<|start|>assistant`` or ``</think>`` in a prefilled message (`continue_final_message`)
        is text, and neither opens a frame nor closes reasoning."""
        if self.has_frames:
            frame = frame_start(prompt.text, self.output.frames, self.message_ends, prompt.control_text)
        elif self.has_channels:
            frame = channel_start(prompt.text, self.output.channels, prompt.control_text)
        else:
            frame = FrameStart()
        lead = ""
        if prompt.reasoning_state is ReasoningState.CLOSED:
            prefill_at = len(prompt.text) - len(prompt.assistant_prefill)
            lead = pending_answer_lead(prompt.assistant_prefill, self.output.think, prompt.control_text[prefill_at:])
        return OutputStart(reasoning=prompt.reasoning_state, frame=frame, answer_lead=lead)


def _last_header(prompt_text: str, control_text: str | None, start_control: str, ends: Sequence[str],
                 message_control: str) -> tuple[str, bool] | None:
    """The header after the last start control, and whether its message control completed it; None
    without a start control or when an end marker closed that message. Controls are found in
    `control_text` (the prompt with client markers escaped, `Prompt.control_text`; default
    `prompt_text`) and the header is the `prompt_text` at the same offsets."""
    controls = prompt_text if control_text is None else control_text
    at = controls.rfind(start_control)
    if at < 0:
        return None
    begin = at + len(start_control)
    tail = controls[begin:]
    if any(end and end in tail for end in ends):
        return None
    header_len = tail.find(message_control)
    if header_len < 0:
        return prompt_text[begin:], False
    return prompt_text[begin:begin + header_len], True


def frame_start(prompt_text: str, frames: RecipientSyntax, message_ends: Sequence[str] = (),
                control_text: str | None = None) -> FrameStart:
    """Where generation starts among recipient frames, read from the end of the prompt text.

    After the last start control: a closed message (an end marker follows) -> BOUNDARY; a header
    without its message control -> HEADER (the header text so far); a complete header -> BODY of
    its recipient. No start control, or a body header that does not parse -> BOUNDARY. Controls are
    read in `control_text` where given (see `_last_header`).
    """
    last = _last_header(prompt_text, control_text, frames.start_control,
                        (frames.end_message_control, *message_ends), frames.message_control)
    if last is None:
        return FrameStart()
    header, is_complete = last
    if not is_complete:
        return FrameStart(FramePosition.HEADER, header_text=header)
    expected = frames.role + frames.recipient_prefix
    recipient = header[len(expected):].strip() if header.startswith(expected) else ""
    if not recipient:
        return FrameStart()
    return FrameStart(FramePosition.BODY, recipient=recipient)


def channel_start(prompt_text: str, channels: ChannelSyntax, control_text: str | None = None) -> FrameStart:
    """Where generation starts among harmony frames, read from the end of the prompt text: after
    the last start control, a closed message -> BOUNDARY; a header without its message control ->
    HEADER (its text, controls spelled inline); a complete header -> BODY (``recipient`` holds the
    whole header text, which the parser reads as it reads a generated one). Controls are read in
    `control_text` where given (see `_last_header`)."""
    last = _last_header(prompt_text, control_text, channels.start_control,
                        (channels.end_control, channels.call_control, channels.return_control),
                        channels.message_control)
    if last is None:
        return FrameStart()
    header, is_complete = last
    if not is_complete:
        return FrameStart(FramePosition.HEADER, header_text=header)
    return FrameStart(FramePosition.BODY, recipient=header) if header else FrameStart()

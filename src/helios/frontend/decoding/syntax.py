"""Output syntax data: the spellings that reasoning and tool parsers recognise.

Everything here is plain, immutable data. At run time it comes from the serving contract's
frontend section (a recipe declares it; the contract mapping builds these records); nothing is keyed
by model identity. The `example_*` functions at the end are documentation and test data only.

Two independent selectors choose the parser algorithms (mirroring the contract's enums, whose zero
value selects nothing): `ReasoningSyntaxKind` and `ToolSyntaxKind`. `OutputSyntax` bundles the
selectors with their data and validates the legal pairings when constructed:

- THINK_TAGS pairs with NONE, QWEN_CODER_FUNCTIONS, GLM_ARGUMENTS, DSML, XTML or JSON_CALLS tools;
- XTML_THINK requires XTML tools;
- RECIPIENT_HEADERS and ATEM_RECIPIENTS require each other (one parser consumes whole frames);
- HARMONY_CHANNELS reasoning and HARMONY_CHANNELS tools require each other (likewise);
- a reasoning terminal marker must be the declared tool syntax's opener.

Single-token status is not syntax data: the parsers are told at construction which spellings the
tokenizer encodes as one token (`helios.frontend.parsers.delimiters.TokenDelimiters`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Union

from helios.errors import ContractError


class ReasoningSyntaxKind(enum.IntEnum):
    """Reasoning parser selector (mirrors the contract enum; numbers are stable)."""

    UNSPECIFIED = 0
    NONE = 1  # the output carries no reasoning
    THINK_TAGS = 2  # open/close delimiters around raw reasoning text
    XTML_THINK = 3  # XTML think element: XML-escaped reasoning text (requires XTML tools)
    RECIPIENT_HEADERS = 4  # `self` frames of the recipient-header syntax (requires ATEM tools)
    HARMONY_CHANNELS = 5  # reasoning-channel messages of harmony frames (requires harmony tools)


class ToolSyntaxKind(enum.IntEnum):
    """Tool parser selector (mirrors the contract enum; numbers are stable)."""

    UNSPECIFIED = 0
    NONE = 1  # the output carries no tool calls
    QWEN_CODER_FUNCTIONS = 2  # <tool_call><function=NAME><parameter=P>VALUE</parameter>...
    GLM_ARGUMENTS = 3  # <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
    DSML = 4  # <｜DSML｜invoke name="..."><｜DSML｜parameter name="..." string="true|false">...
    XTML = 5  # <xtml:calls><xtml:call name="..."><xtml:arg name="...">escaped</xtml:arg>...
    ATEM_RECIPIENTS = 6  # <atem:function_calls> blocks inside tool recipient frames
    JSON_CALLS = 7  # <tool_call>{"name": ..., "arguments": {...}}</tool_call>, [TOOL_CALLS][...], ...
    HARMONY_CHANNELS = 8  # <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}


@dataclass(frozen=True)
class ThinkSyntax:
    """Reasoning delimiters and the wrapping text around them.

    Wrapping strings are removed where present: ``after_open`` from the start of the reasoning,
    ``before_close`` from its end, ``after_close`` from the start of the answer (each: the longest
    part of the text that matches the wrapping string from its outer side; ``before_close`` also
    before a terminal marker). ``terminal`` is a marker
    that also ends reasoning and then belongs to the answer; empty when the syntax has none.
    """

    open: str
    close: str
    after_open: str = ""
    before_close: str = ""
    after_close: str = ""
    terminal: str = ""


@dataclass(frozen=True)
class QwenCoderSyntax:
    """``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``.

    ``value_wrap`` is removed from both ends of each value; ``block_lead`` from the answer text that
    precedes a block. Whitespace between tags is a separator.
    """

    block_open: str
    block_close: str
    function_open: str  # followed by the function name and ``tag_end``
    function_close: str
    parameter_open: str  # followed by the parameter name and ``tag_end``
    parameter_close: str
    tag_end: str
    value_wrap: str = ""
    block_lead: str = ""


@dataclass(frozen=True)
class GlmArgumentSyntax:
    """``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>``.

    The name follows the opener and ends at ``name_separator`` (or at the first key or the closer).
    """

    block_open: str
    block_close: str
    name_separator: str
    key_open: str
    key_close: str
    value_open: str
    value_close: str
    block_lead: str = ""


@dataclass(frozen=True)
class ElementToolSyntax:
    """Element-style calls: a block holding invocations whose name is an attribute, holding
    parameters whose name is an attribute. Used by DSML, XTML and ATEM::

        BLOCK_OPEN INVOKE_OPEN name ATTRIBUTE_END
          PARAMETER_OPEN key [STRING_ATTRIBUTE flag] ATTRIBUTE_END value PARAMETER_CLOSE ...
        INVOKE_CLOSE ... BLOCK_CLOSE

    ``string_attribute`` (DSML only) introduces a flag: ``string_true`` keeps the value raw,
    ``string_false`` means the value is JSON. Without it, values are typed by the tool's schema.
    """

    block_open: str
    block_close: str
    invoke_open: str
    invoke_close: str
    parameter_open: str
    parameter_close: str
    attribute_end: str
    string_attribute: str = ""
    string_true: str = "true"
    string_false: str = "false"
    block_lead: str = ""


@dataclass(frozen=True)
class RecipientSyntax:
    """Recipient-header frames: ``START ROLE RECIPIENT_PREFIX recipient MESSAGE body [END_MESSAGE]``.

    The three controls delimit only as their tokenizer tokens. ``reasoning_recipient`` frames carry
    reasoning, ``content_recipients`` frames visible content; ``generic_tool_recipient`` accepts any
    registered invocation, ``named_tool_prefix`` + NAME requires invocation NAME. Tool frame bodies
    use ``tools`` (ATEM element syntax), one invocation per frame.
    """

    start_control: str
    message_control: str
    end_message_control: str
    role: str
    recipient_prefix: str
    reasoning_recipient: str
    content_recipients: tuple[str, ...]
    generic_tool_recipient: str
    named_tool_prefix: str
    tools: ElementToolSyntax


@dataclass(frozen=True)
class ChannelSyntax:
    """Harmony channel frames::

        START ROLE [MARKER recipient] CHANNEL channel [MARKER recipient] [CONSTRAIN type] MESSAGE body END

    The seven controls delimit only as their tokenizer tokens. A message on a ``reasoning_channels``
    channel is reasoning; one on a ``content_channels`` channel without a recipient is content; one
    addressed to ``tool_namespace`` + NAME is a call of NAME whose body is the JSON arguments.
    ``end_control`` permits another header; ``call_control`` and ``return_control`` end a message
    (normally the EOS tokens ending generation). ``final_channel``, ``tool_channel`` and
    ``tool_content_type`` are what grammars write for a structured answer and a forced call.
    """

    start_control: str
    channel_control: str
    message_control: str
    end_control: str
    call_control: str
    return_control: str
    constrain_control: str
    role: str
    recipient_marker: str
    reasoning_channels: tuple[str, ...]
    content_channels: tuple[str, ...]
    tool_namespace: str
    final_channel: str
    tool_channel: str
    tool_content_type: str

    @property
    def controls(self) -> tuple[str, ...]:
        return (self.start_control, self.channel_control, self.message_control, self.end_control,
                self.call_control, self.return_control, self.constrain_control)


@dataclass(frozen=True)
class JsonCallSyntax:
    """JSON invocations inside an optional block: ``BLOCK_OPEN calls BLOCK_CLOSE``.

    With ``name_key`` the calls are JSON objects ``{NAME_KEY: name, ARGUMENTS_KEY: {...}}`` (one, a
    JSON array of them, or several separated by whitespace, commas or semicolons). Without it each
    call is markup: ``INVOKE_OPEN name NAME_END ARGUMENTS_OPEN {...} ARGUMENTS_CLOSE INVOKE_CLOSE``.
    An empty ``block_open`` means an answer whose first non-whitespace character opens a JSON
    object or array is the block; an empty ``block_close`` means the block runs to the output's end.
    """

    block_open: str = ""
    block_close: str = ""
    name_key: str = ""
    arguments_key: str = ""
    invoke_open: str = ""
    name_end: str = ""
    arguments_open: str = ""
    arguments_close: str = ""
    invoke_close: str = ""
    block_lead: str = ""

    def __post_init__(self) -> None:
        if bool(self.name_key) == bool(self.invoke_open):
            raise ContractError("frontend.tools.name_key", "JSON calls are named either by a key or by markup")
        if self.name_key and not self.arguments_key:
            raise ContractError("frontend.tools.arguments_key", "JSON call objects need an arguments key")
        if self.invoke_open and not self.name_end:
            raise ContractError("frontend.tools.name_end", "a named JSON call needs the text ending its name")


ToolSyntax = Union[QwenCoderSyntax, GlmArgumentSyntax, ElementToolSyntax, JsonCallSyntax]

_TOOL_DATA = {
    ToolSyntaxKind.QWEN_CODER_FUNCTIONS: QwenCoderSyntax,
    ToolSyntaxKind.GLM_ARGUMENTS: GlmArgumentSyntax,
    ToolSyntaxKind.DSML: ElementToolSyntax,
    ToolSyntaxKind.XTML: ElementToolSyntax,
    ToolSyntaxKind.JSON_CALLS: JsonCallSyntax,
}
_THINK_TOOLS = (
    ToolSyntaxKind.NONE,
    ToolSyntaxKind.QWEN_CODER_FUNCTIONS,
    ToolSyntaxKind.GLM_ARGUMENTS,
    ToolSyntaxKind.DSML,
    ToolSyntaxKind.XTML,
    ToolSyntaxKind.JSON_CALLS,
)
_OPTIONAL_TEXT = {
    "after_open", "before_close", "after_close", "terminal", "value_wrap", "block_lead",
    "string_attribute", "named_tool_prefix",
}


@dataclass(frozen=True)
class OutputSyntax:
    """The selected parser pair and its syntax data; validated on construction (ContractError).

    ``think`` is set for THINK_TAGS and XTML_THINK; ``tools`` for tag tool syntaxes;
    ``frames`` for the RECIPIENT_HEADERS / ATEM_RECIPIENTS pair (its ATEM data is ``frames.tools``);
    ``channels`` for the HARMONY_CHANNELS pair.
    """

    reasoning_kind: ReasoningSyntaxKind
    tool_kind: ToolSyntaxKind
    think: ThinkSyntax | None = None
    tools: ToolSyntax | None = None
    frames: RecipientSyntax | None = None
    channels: ChannelSyntax | None = None

    def __post_init__(self) -> None:
        _check_kinds(self)
        _check_data(self)
        for name in ("think", "tools", "frames", "channels"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, JsonCallSyntax):  # it checks itself
                _check_spellings(value, f"frontend.{name}")
        if self.think is not None and self.think.terminal:
            opener = self.tools.block_open if self.tools is not None else ""
            if self.think.terminal != opener:
                raise ContractError(
                    "frontend.think.terminal",
                    f"reasoning terminal marker {self.think.terminal!r} is not the tool opener {opener!r}",
                )

    def delimiter_spellings(self) -> tuple[str, ...]:
        """Spellings whose single-token status the parsers need from the tokenizer."""
        if self.frames is not None:
            f = self.frames
            return (f.start_control, f.message_control, f.end_message_control)
        if self.channels is not None:
            return self.channels.controls
        if self.think is not None:
            return tuple(s for s in (self.think.open, self.think.close, self.think.terminal) if s)
        return ()


def _check_kinds(syntax: OutputSyntax) -> None:
    reasoning, tool = syntax.reasoning_kind, syntax.tool_kind
    if not isinstance(reasoning, ReasoningSyntaxKind) or reasoning == ReasoningSyntaxKind.UNSPECIFIED:
        raise ContractError("frontend.reasoning_parser", f"no reasoning parser selected: {reasoning!r}")
    if not isinstance(tool, ToolSyntaxKind) or tool == ToolSyntaxKind.UNSPECIFIED:
        raise ContractError("frontend.tool_parser", f"no tool parser selected: {tool!r}")
    frames = ReasoningSyntaxKind.RECIPIENT_HEADERS, ToolSyntaxKind.ATEM_RECIPIENTS
    if (reasoning == frames[0]) != (tool == frames[1]):
        raise ContractError(
            "frontend.tool_parser", "recipient-header reasoning and ATEM recipient tools are only used together"
        )
    harmony = ReasoningSyntaxKind.HARMONY_CHANNELS, ToolSyntaxKind.HARMONY_CHANNELS
    if (reasoning == harmony[0]) != (tool == harmony[1]):
        raise ContractError("frontend.tool_parser", "harmony channel reasoning and tools are only used together")
    if reasoning == ReasoningSyntaxKind.XTML_THINK and tool != ToolSyntaxKind.XTML:
        raise ContractError("frontend.tool_parser", "XTML think reasoning requires the XTML tool parser")
    if reasoning == ReasoningSyntaxKind.THINK_TAGS and tool not in _THINK_TOOLS:
        raise ContractError("frontend.tool_parser", f"think-tag reasoning cannot pair with {tool.name}")


def _check_data(syntax: OutputSyntax) -> None:
    reasoning, tool = syntax.reasoning_kind, syntax.tool_kind
    wants_think = reasoning in (ReasoningSyntaxKind.THINK_TAGS, ReasoningSyntaxKind.XTML_THINK)
    if wants_think != (syntax.think is not None):
        raise ContractError("frontend.think", f"think syntax data must be present exactly for {reasoning.name}")
    wants_frames = tool == ToolSyntaxKind.ATEM_RECIPIENTS
    if wants_frames != (syntax.frames is not None):
        raise ContractError("frontend.frames", "recipient syntax data must be present exactly for ATEM_RECIPIENTS")
    if (tool == ToolSyntaxKind.HARMONY_CHANNELS) != (syntax.channels is not None):
        raise ContractError("frontend.channels", "channel syntax data must be present exactly for HARMONY_CHANNELS")
    expected = _TOOL_DATA.get(tool)
    if expected is None:
        if syntax.tools is not None:
            raise ContractError("frontend.tools", f"{tool.name} takes no tool syntax data")
    elif type(syntax.tools) is not expected:
        raise ContractError("frontend.tools", f"{tool.name} needs {expected.__name__} data")
    if tool == ToolSyntaxKind.DSML and not syntax.tools.string_attribute:
        raise ContractError("frontend.tools.string_attribute", "DSML parameters declare a string attribute")
    if tool == ToolSyntaxKind.XTML and syntax.tools.string_attribute:
        raise ContractError("frontend.tools.string_attribute", "XTML values are typed by the tool schema")
    if wants_frames and syntax.frames.tools.string_attribute:
        raise ContractError("frontend.frames.tools.string_attribute", "ATEM values are typed by the tool schema")


def _check_spellings(data: object, path: str) -> None:
    """Every required spelling is a non-empty string; wrapping text may be empty."""
    for item in fields(data):
        value = getattr(data, item.name)
        where = f"{path}.{item.name}"
        if isinstance(value, str):
            if not value and item.name not in _OPTIONAL_TEXT:
                raise ContractError(where, "must not be empty")
        elif isinstance(value, tuple):
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ContractError(where, "must be a non-empty list of non-empty strings")
        elif isinstance(value, ElementToolSyntax):
            _check_spellings(value, where)


# Example data: documentation and tests only. Runtime syntax comes from the serving contract.


def example_think_tags(terminal: str = "") -> ThinkSyntax:
    """``<think>\\nREASONING\\n</think>\\n\\nANSWER``."""
    return ThinkSyntax("<think>", "</think>", "\n", "\n", "\n\n", terminal)


def example_xtml_think() -> ThinkSyntax:
    """``<xtml:think>ESCAPED REASONING</xtml:think>\\nANSWER``, ended early by an XTML call block."""
    return ThinkSyntax("<xtml:think>", "</xtml:think>", "\n", "\n", "\n", "<xtml:calls>")


def example_qwen_coder() -> QwenCoderSyntax:
    return QwenCoderSyntax(
        "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">",
        value_wrap="\n", block_lead="\n\n",
    )


def example_glm_arguments() -> GlmArgumentSyntax:
    return GlmArgumentSyntax(
        "<tool_call>", "</tool_call>", "\n", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
        block_lead="\n",
    )


def example_dsml() -> ElementToolSyntax:
    marker = "｜DSML｜"
    return ElementToolSyntax(
        f"<{marker}function_calls>", f"</{marker}function_calls>",
        f'<{marker}invoke name="', f"</{marker}invoke>",
        f'<{marker}parameter name="', f"</{marker}parameter>", '">',
        string_attribute='" string="', block_lead="\n\n",
    )


def example_xtml() -> ElementToolSyntax:
    return ElementToolSyntax(
        "<xtml:calls>", "</xtml:calls>", '<xtml:call name="', "</xtml:call>",
        '<xtml:arg name="', "</xtml:arg>", '">', block_lead="\n",
    )


def example_atem() -> ElementToolSyntax:
    return ElementToolSyntax(
        "<atem:function_calls>", "</atem:function_calls>", '<atem:invoke name="', "</atem:invoke>",
        '<atem:parameter name="', "</atem:parameter>", '">',
    )


def example_recipients() -> RecipientSyntax:
    return RecipientSyntax(
        "<|start|>", "<|message|>", "<|eom|>", "assistant", " to=", "self", ("commentary", "user"),
        "functions", "functions.", example_atem(),
    )


def example_harmony() -> ChannelSyntax:
    """gpt-oss's harmony format."""
    return ChannelSyntax(
        "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>",
        "assistant", "to=", ("analysis",), ("final", "commentary"), "functions.", "final", "commentary", "json",
    )


def example_hermes() -> JsonCallSyntax:
    """``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`` (Qwen2.5, Qwen3)."""
    return JsonCallSyntax("<tool_call>", "</tool_call>", name_key="name", arguments_key="arguments")


def example_deepseek_v3() -> JsonCallSyntax:
    """DeepSeek-V3 tool-call tokens with a fenced JSON argument object."""
    return JsonCallSyntax(
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", invoke_open="<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
        name_end="\n", arguments_open="```json\n", arguments_close="\n```", invoke_close="<｜tool▁call▁end｜>",
    )

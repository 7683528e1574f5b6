"""Frontend families: the tool-call syntax each checkpoint family's template renders, as contract data.

A family is chosen from what the chat template renders for a probe tool call (`probes.tool_call_text`)
with `config.json`'s ``model_type`` breaking ties; ``--frontend family=NAME`` states it instead.
Reasoning is not part of a family: think tags are declared exactly when the template renders them
(`probes.reasoning_facts`), so a DeepSeek-V3 template (no think tags) serves without reasoning while
a DeepSeek-V3.1 or Qwen3 template, whose generation prompts open or close reasoning, reasons.

| family | model_type (examples) | tool syntax (parser) |
|---|---|---|
| qwen3-coder | qwen3_moe, qwen3 | `<tool_call><function=NAME><parameter=K>V</parameter>` (QWEN_CODER_FUNCTION_TAGS) |
| hermes | qwen2, qwen3 | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (JSON_CALLS) |
| glm-4.5 | glm4_moe | `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>` (GLM_ARGUMENT_TAGS) |
| deepseek-v3 | deepseek_v3 | tool-call tokens, `function<｜tool▁sep｜>NAME` + fenced JSON (JSON_CALLS) |
| deepseek-v3.1 | deepseek_v3 | tool-call tokens, `NAME<｜tool▁sep｜>{...}` (JSON_CALLS) |
| deepseek-v3.2 | deepseek_v32 | DSML invoke/parameter elements (DSML) |
| llama3 | llama | bare `{"name": ..., "parameters": {...}}` answer (JSON_CALLS) |
| mistral | mistral, mixtral | `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (JSON_CALLS) |
| mistral-args | mistral, mixtral | `[TOOL_CALLS]NAME[ARGS]{...}`, one `[TOOL_CALLS]` per call (JSON_CALLS) |
| xtml | - | `<xtml:calls><xtml:call name=...>` (XTML; XTML think reasoning) |
| harmony | gpt_oss | `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}` (HARMONY_CHANNELS; analysis channel reasoning) |

A family with ``channel_syntax`` (harmony) declares both parsers itself: its frames carry reasoning
on their own channels, so the think-tag probe does not apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.frontend.probes import TOOL_NAME


@dataclass(frozen=True)
class Family:
    """One family's tool syntax and the rendered markup that identifies it."""

    name: str
    model_types: tuple[str, ...]
    markers: tuple[str, ...]  # all present in a rendered probe tool call
    tool_parser: int
    tool_syntax: spb.ToolSyntax
    reasoning_ends_at_tools: bool = False  # the tool opener is a reasoning terminal marker
    channel_syntax: spb.ChannelSyntax | None = None  # harmony frames: tool_syntax is unused

    def matches(self, rendered: str) -> bool:
        return all(marker in rendered for marker in self.markers)


_DS = "｜DSML｜"
FAMILIES = (
    Family("qwen3-coder", ("qwen3_moe", "qwen3", "qwen3_next"), ("<tool_call>", f"<function={TOOL_NAME}>"),
           spb.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS, spb.ToolSyntax(
               opener="<tool_call>", closer="</tool_call>", tag_separator="\n", wrapping_newlines=1,
               invoke_open="<function=", invoke_close="</function>", parameter_open="<parameter=",
               parameter_close="</parameter>", name_end=">", block_lead="\n\n"), reasoning_ends_at_tools=True),
    Family("glm-4.5", ("glm4_moe", "glm4"), ("<tool_call>", "<arg_key>"), spb.TOOL_PARSER_GLM_ARGUMENT_TAGS,
           spb.ToolSyntax(opener="<tool_call>", closer="</tool_call>", tag_separator="\n",
                          parameter_open="<arg_key>", name_end="</arg_key>", value_open="<arg_value>",
                          parameter_close="</arg_value>", block_lead="\n"), reasoning_ends_at_tools=True),
    Family("deepseek-v3.2", ("deepseek_v32", "deepseek_v3"), (f"<{_DS}invoke",), spb.TOOL_PARSER_DSML,
           spb.ToolSyntax(opener=f"<{_DS}function_calls>", closer=f"</{_DS}function_calls>",
                          invoke_open=f'<{_DS}invoke name="', invoke_close=f"</{_DS}invoke>",
                          parameter_open=f'<{_DS}parameter name="', parameter_close=f"</{_DS}parameter>",
                          name_end='">', string_attribute='" string="', string_true="true", string_false="false",
                          tag_separator="\n", block_lead="\n\n")),  # encoding_dsv32: content, "\n\n", block
    Family("deepseek-v3", ("deepseek_v3",), ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>",), spb.TOOL_PARSER_JSON_CALLS,
           spb.ToolSyntax(opener="<｜tool▁calls▁begin｜>", closer="<｜tool▁calls▁end｜>",
                          invoke_open="<｜tool▁call▁begin｜>function<｜tool▁sep｜>", name_end="\n",
                          arguments_open="```json\n", arguments_close="\n```", invoke_close="<｜tool▁call▁end｜>")),
    Family("deepseek-v3.1", ("deepseek_v3",), (f"<｜tool▁call▁begin｜>{TOOL_NAME}<｜tool▁sep｜>",),
           spb.TOOL_PARSER_JSON_CALLS,
           spb.ToolSyntax(opener="<｜tool▁calls▁begin｜>", closer="<｜tool▁calls▁end｜>",
                          invoke_open="<｜tool▁call▁begin｜>", name_end="<｜tool▁sep｜>",
                          invoke_close="<｜tool▁call▁end｜>")),
    # The name as a JSON string: this family's calls are JSON objects (any spacing), the newer ones are not.
    Family("mistral", ("mistral", "mixtral", "ministral"), ("[TOOL_CALLS]", f'"{TOOL_NAME}"'),
           spb.TOOL_PARSER_JSON_CALLS,
           spb.ToolSyntax(opener="[TOOL_CALLS]", name_key="name", arguments_key="arguments")),
    # Newer Mistral templates (tokenizer v13): no array, each call opened by its own [TOOL_CALLS]; the
    # block opener is also the first call's invocation opener (json_calls reads it so).
    Family("mistral-args", ("mistral", "mixtral", "ministral"), (f"[TOOL_CALLS]{TOOL_NAME}[ARGS]",),
           spb.TOOL_PARSER_JSON_CALLS,
           spb.ToolSyntax(opener="[TOOL_CALLS]", invoke_open="[TOOL_CALLS]", name_end="[ARGS]")),
    Family("hermes", ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"), ("<tool_call>", f'"name": "{TOOL_NAME}"'),
           spb.TOOL_PARSER_JSON_CALLS,
           spb.ToolSyntax(opener="<tool_call>", closer="</tool_call>", name_key="name", arguments_key="arguments")),
    Family("llama3", ("llama",), (f'"name": "{TOOL_NAME}"', '"parameters"'), spb.TOOL_PARSER_JSON_CALLS,
           spb.ToolSyntax(name_key="name", arguments_key="parameters")),
    Family("xtml", (), ("<xtml:calls>",), spb.TOOL_PARSER_XTML,
           spb.ToolSyntax(opener="<xtml:calls>", closer="</xtml:calls>", invoke_open='<xtml:call name="',
                          invoke_close="</xtml:call>", parameter_open='<xtml:arg name="',
                          parameter_close="</xtml:arg>", name_end='">', tag_separator="\n"),
           reasoning_ends_at_tools=True),
)
HARMONY = spb.ChannelSyntax(
    start_control="<|start|>", channel_control="<|channel|>", message_control="<|message|>", end_control="<|end|>",
    call_control="<|call|>", return_control="<|return|>", constrain_control="<|constrain|>", role="assistant",
    recipient_marker="to=", reasoning_channels=["analysis"], content_channels=["final", "commentary"],
    tool_namespace="functions.", final_channel="final", tool_channel="commentary", tool_content_type="json",
)
FAMILIES += (
    Family("harmony", ("gpt_oss",), ("<|channel|>", f"to=functions.{TOOL_NAME}"), spb.TOOL_PARSER_HARMONY_CHANNELS,
           spb.ToolSyntax(), channel_syntax=HARMONY),
)
BY_NAME = {family.name: family for family in FAMILIES}
# Rendered markup of syntaxes no parser here reads; naming them beats a silent "no tools".
UNSUPPORTED = {
    "<|channel|>": "harmony channels without function recipients",
    "<|python_tag|>": "Llama built-in tool calls",
    "[CALL_ID]": "Mistral calls carrying their id, [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}",
}


def select_family(rendered_call: str, model_type: str, stated: str | None) -> Family | None:
    """The family for a rendered probe tool call (None: the template renders no tool calls)."""
    if stated is not None:
        if stated == "none":
            return None
        if stated not in BY_NAME:
            raise CheckpointError(f"unknown frontend family {stated!r}; known: none, {', '.join(BY_NAME)}")
        return BY_NAME[stated]
    if not rendered_call:
        return None
    matching = [family for family in FAMILIES if family.matches(rendered_call)]
    if not matching:
        known = [name for marker, name in UNSUPPORTED.items() if marker in rendered_call]
        what = f" ({known[0]})" if known else ""
        raise CheckpointError(
            f"the chat template renders tool calls in a syntax no tool parser reads{what}: "
            f"{rendered_call.strip()[:160]!r}; state one with --frontend family=NAME "
            f"(known: none, {', '.join(BY_NAME)})"
        )
    preferred = [family for family in matching if model_type in family.model_types]
    return (preferred or matching)[0]

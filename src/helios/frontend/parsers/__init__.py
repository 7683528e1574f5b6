"""Incremental output parsers: reasoning and tool-call syntaxes, paired by `OutputPipeline`.

Modules: `pipeline` (pairing and routing), `think_tags` (delimited reasoning), `xtml` (XTML think and
calls), `recipient_frames` (recipient headers with ATEM calls), `harmony` (harmony channel
frames with JSON calls), `tag_tools` (the tool-call state
machine and its recovery rules) with one grammar module per tool family (`qwen_coder`,
`glm_arguments`, `dsml`, `atem`) compiled to a `tool_grammar.ToolGrammar`, `json_calls` (whole JSON
invocations: Hermes, Llama, Mistral and DeepSeek tool-call tokens), and helpers (`scan`, `text`, `calls`, `values`, `delimiters`,
`start`). Events are defined in `helios.frontend.decoding.events`, syntax data in `helios.frontend.decoding.syntax`.
"""

from helios.frontend.parsers.delimiters import TokenDelimiters
from helios.frontend.parsers.pipeline import OutputPipeline, OutputRequest
from helios.frontend.parsers.start import AnswerMode, FramePosition, FrameStart, OutputStart, ReasoningState
from helios.frontend.parsers.values import ToolRegistry, ToolSpec

__all__ = [
    "AnswerMode",
    "FramePosition",
    "FrameStart",
    "OutputPipeline",
    "OutputRequest",
    "OutputStart",
    "ReasoningState",
    "TokenDelimiters",
    "ToolRegistry",
    "ToolSpec",
]

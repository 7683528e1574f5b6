"""Selector pairing and syntax-data validation (`OutputSyntax`), and pipelines without a parser."""

from __future__ import annotations

import dataclasses

import pytest

from helios.errors import ContractError
from helios.frontend.decoding import syntax as S
from helios.frontend.parsers import OutputPipeline, OutputRequest, TokenDelimiters, ToolRegistry
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T

THINK = S.example_think_tags()
TOOL_DATA = {
    T.NONE: None, T.QWEN_CODER_FUNCTIONS: S.example_qwen_coder(), T.GLM_ARGUMENTS: S.example_glm_arguments(),
    T.DSML: S.example_dsml(), T.XTML: S.example_xtml(),
}


@pytest.mark.parametrize("tool", list(TOOL_DATA))
def test_think_tags_pair_with_every_tag_tool_syntax(tool):
    OutputSyntax(R.THINK_TAGS, tool, think=THINK, tools=TOOL_DATA[tool])
    OutputSyntax(R.NONE, tool, tools=TOOL_DATA[tool])


def test_legal_fixed_pairs():
    OutputSyntax(R.XTML_THINK, T.XTML, think=S.example_xtml_think(), tools=S.example_xtml())
    OutputSyntax(R.RECIPIENT_HEADERS, T.ATEM_RECIPIENTS, frames=S.example_recipients())


@pytest.mark.parametrize(
    "kwargs, path",
    [
        (dict(reasoning_kind=R.UNSPECIFIED, tool_kind=T.NONE), "frontend.reasoning_parser"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.UNSPECIFIED), "frontend.tool_parser"),
        (dict(reasoning_kind=R.XTML_THINK, tool_kind=T.QWEN_CODER_FUNCTIONS, think=THINK, tools=S.example_qwen_coder()),
         "frontend.tool_parser"),
        (dict(reasoning_kind=R.XTML_THINK, tool_kind=T.NONE, think=THINK), "frontend.tool_parser"),
        (dict(reasoning_kind=R.RECIPIENT_HEADERS, tool_kind=T.DSML, tools=S.example_dsml()), "frontend.tool_parser"),
        (dict(reasoning_kind=R.THINK_TAGS, tool_kind=T.ATEM_RECIPIENTS, think=THINK, frames=S.example_recipients()),
         "frontend.tool_parser"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.ATEM_RECIPIENTS, frames=S.example_recipients()), "frontend.tool_parser"),
        (dict(reasoning_kind=R.THINK_TAGS, tool_kind=T.NONE), "frontend.think"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.NONE, think=THINK), "frontend.think"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.DSML, tools=S.example_qwen_coder()), "frontend.tools"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.NONE, tools=S.example_dsml()), "frontend.tools"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.DSML, tools=S.example_xtml()), "frontend.tools.string_attribute"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.XTML, tools=S.example_dsml()), "frontend.tools.string_attribute"),
        (dict(reasoning_kind=R.THINK_TAGS, tool_kind=T.QWEN_CODER_FUNCTIONS, think=S.example_think_tags("<tool>"),
              tools=S.example_qwen_coder()), "frontend.think.terminal"),
        (dict(reasoning_kind=R.THINK_TAGS, tool_kind=T.NONE, think=S.example_think_tags("<tool_call>")),
         "frontend.think.terminal"),
        (dict(reasoning_kind=R.THINK_TAGS, tool_kind=T.NONE, think=dataclasses.replace(THINK, close="")),
         "frontend.think.close"),
        (dict(reasoning_kind=R.NONE, tool_kind=T.QWEN_CODER_FUNCTIONS,
              tools=dataclasses.replace(S.example_qwen_coder(), tag_end="")), "frontend.tools.tag_end"),
        (dict(reasoning_kind=R.RECIPIENT_HEADERS, tool_kind=T.ATEM_RECIPIENTS,
              frames=dataclasses.replace(S.example_recipients(), content_recipients=())), "frontend.frames.content_recipients"),
        (dict(reasoning_kind=R.RECIPIENT_HEADERS, tool_kind=T.ATEM_RECIPIENTS,
              frames=dataclasses.replace(S.example_recipients(), tools=S.example_dsml())), "frontend.frames.tools.string_attribute"),
    ],
)
def test_illegal_pairings_and_data_are_contract_errors(kwargs, path):
    with pytest.raises(ContractError) as caught:
        OutputSyntax(**kwargs)
    assert caught.value.path == path


def test_terminal_marker_equal_to_the_opener_is_legal():
    syntax = OutputSyntax(R.THINK_TAGS, T.DSML, think=S.example_think_tags(S.example_dsml().block_open), tools=S.example_dsml())
    assert syntax.delimiter_spellings() == ("<think>", "</think>", S.example_dsml().block_open)


def test_no_parsers_pass_text_through():
    pipeline = OutputPipeline.create(OutputSyntax(R.NONE, T.NONE), TokenDelimiters(), OutputRequest(ToolRegistry(), "c"))
    assert [e.text for e in pipeline.feed(5, "<think>a</think>")] == ["<think>a</think>"]
    pipeline.finish()
    assert pipeline.result().content == "<think>a</think>"
    with pytest.raises(ValueError):
        pipeline.feed(5, "late")


def test_tools_without_reasoning():
    syntax = OutputSyntax(R.NONE, T.GLM_ARGUMENTS, tools=S.example_glm_arguments())
    tools = ToolRegistry.from_openai([{"type": "function", "function": {"name": "f"}}])
    pipeline = OutputPipeline.create(syntax, TokenDelimiters(), OutputRequest(tools, "id-"))
    pipeline.feed(1, "x\n<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>")
    pipeline.finish()
    result = pipeline.result()
    assert result.content == "x" and result.tool_calls[0].call_id == "id-0"
    assert result.tool_calls[0].arguments == '{"a": "1"}'  # undeclared parameters are strings

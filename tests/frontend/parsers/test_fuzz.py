"""Random markup soup for every syntax: parsers never raise, keep their event invariants, and give
the same result for any legal feeding of the same tokens (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.frontend.decoding import syntax as S
from helios.frontend.parsers import (
    AnswerMode, FramePosition, FrameStart, OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters,
)
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T

from .golden import FILLER_ID, check_stream_invariants, coarsest, random_chunks, run
from .tools import TOOLS

COMMON = ["get_weather", "get_time", "nope", "city", "days", "options", "3", "x y", '{"a": [1]}', "&lt;", "&amp",
          "\n", " ", "<", ">", '"', "=", "</", "ab", "🧪", "東"]
M = "｜DSML｜"
CONFIGS = {
    "qwen": (
        OutputSyntax(R.THINK_TAGS, T.QWEN_CODER_FUNCTIONS, S.example_think_tags("<tool_call>"), S.example_qwen_coder()),
        {"<think>": 1, "</think>": 2, "<tool_call>": 3},
        ["</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<tool_c"],
    ),
    "glm": (
        OutputSyntax(R.THINK_TAGS, T.GLM_ARGUMENTS, S.example_think_tags(), S.example_glm_arguments()),
        {"<think>": 1, "</think>": 2},
        ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<arg_"],
    ),
    "dsml": (
        OutputSyntax(R.THINK_TAGS, T.DSML, S.example_think_tags(f"<{M}function_calls>"), S.example_dsml()),
        {"<think>": 1, "</think>": 2},
        [f"<{M}function_calls>", f"</{M}function_calls>", f'<{M}invoke name="', '">', f"</{M}invoke>",
         f'<{M}parameter name="', '" string="', "true", "false", f"</{M}parameter>", f"<{M}"],
    ),
    "xtml": (
        OutputSyntax(R.XTML_THINK, T.XTML, S.example_xtml_think(), S.example_xtml()),
        {},
        ["<xtml:think>", "</xtml:think>", "<xtml:calls>", "</xtml:calls>", '<xtml:call name="', '">', "</xtml:call>",
         '<xtml:arg name="', "</xtml:arg>", "<xtml:"],
    ),
    "recipients": (
        OutputSyntax(R.RECIPIENT_HEADERS, T.ATEM_RECIPIENTS, frames=S.example_recipients()),
        {"<|start|>": 1, "<|message|>": 2, "<|eom|>": 3},
        ["assistant to=", "self", "user", "commentary", "functions", "functions.get_weather", "functions.nope",
         "<atem:function_calls>", "</atem:function_calls>", '<atem:invoke name="', '">', "</atem:invoke>",
         '<atem:parameter name="', "</atem:parameter>", "<|eom|>"],
    ),
}
STARTS = [
    OutputStart(ReasoningState.OPEN), OutputStart(ReasoningState.UNOPENED), OutputStart(ReasoningState.CLOSED),
    OutputStart(frame=FrameStart(FramePosition.HEADER, header_text="assistant")),
    OutputStart(frame=FrameStart(FramePosition.BODY, recipient="functions")),
]


@pytest.mark.parametrize("name", CONFIGS)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_markup_soup(name, data):
    syntax, ids, fragments = CONFIGS[name]
    delimiters = TokenDelimiters(ids)
    pieces = st.one_of(st.sampled_from(COMMON + fragments), st.sampled_from(sorted(ids.items())) if ids else st.nothing())
    stream = [
        (p[1], p[0]) if isinstance(p, tuple) else (FILLER_ID, p)
        for p in data.draw(st.lists(pieces, max_size=40), label="pieces")
    ]
    start = data.draw(st.sampled_from(STARTS), label="start")
    answer = data.draw(st.sampled_from(AnswerMode), label="answer")
    make = lambda: OutputPipeline.create(syntax, delimiters, OutputRequest(TOOLS, "c", start, answer))
    reference = run(make(), stream)
    check_stream_invariants(reference.events, reference.result, "c")
    rng = random.Random(data.draw(st.integers(0, 2**32), label="chunking seed"))
    for feeds in (coarsest(stream, delimiters), random_chunks(stream, delimiters, rng), random_chunks(stream, delimiters, rng)):
        other = run(make(), feeds)
        check_stream_invariants(other.events, other.result, "c")
        assert other.result == reference.result

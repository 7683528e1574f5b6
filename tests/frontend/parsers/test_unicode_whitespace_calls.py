"""JSON tool calls around Unicode whitespace: what `str.lstrip` reads as whitespace before a Llama
call (U+00A0, U+3000, U+2028...) is whitespace to the block parser too, in every JSON-call family.

The Llama parser decides that an answer is a call when its first non-whitespace character opens JSON
(Unicode whitespace, `str.lstrip`), while the block parser skipped only ASCII whitespace: an answer
``"\\u00a0{"name": ...}"`` was reported `MALFORMED_CALL` and returned as text, where ``" {"name": ...}"``
was a call.
"""

from __future__ import annotations

import json

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.decoding.syntax import JsonCallSyntax, OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters

from .golden import FILLER_ID, check_stream_invariants, run
from .tools import TOOLS

LLAMA = OutputSyntax(R.NONE, T.JSON_CALLS, tools=JsonCallSyntax(name_key="name", arguments_key="parameters"))
HERMES = OutputSyntax(R.THINK_TAGS, T.JSON_CALLS, S.example_think_tags(), S.example_hermes())
DEEPSEEK = OutputSyntax(R.NONE, T.JSON_CALLS, tools=S.example_deepseek_v3())
SPACES = ["\u00a0", "\u3000", "\u2028", "\u2029", "\u2003", "\x85", " \u00a0\n"]
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


def _parse(syntax: OutputSyntax, text: str, size: int):
    request = OutputRequest(TOOLS, "c", OutputStart(ReasoningState.CLOSED))
    pipeline = OutputPipeline.create(syntax, TokenDelimiters({}), request)
    outcome = run(pipeline, [(FILLER_ID, text[at:at + size]) for at in range(0, len(text), size)])
    check_stream_invariants(outcome.events, outcome.result, "c")
    return outcome.result


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("size", [1, 3, 10**6])
def test_llama_call_after_unicode_whitespace_is_a_call(space, size):
    for text in (space + CALL, CALL + space, space + CALL + space):
        result = _parse(LLAMA, text, size)
        assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert result.content == "" and result.errors == ()
        assert result.markup == text  # the whitespace is the call's wrapping, not lost


@pytest.mark.parametrize("space", SPACES)
def test_block_bodies_skip_unicode_whitespace(space):
    hermes = f'Hi<tool_call>{space}{{"name": "get_weather", "arguments": {{"days": 2}}}}{space}</tool_call>'
    deepseek = (f"Hi<｜tool▁calls▁begin｜>{space}<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                f'{{"days": 2}}{space}\n```{space}<｜tool▁call▁end｜>{space}<｜tool▁calls▁end｜>')
    for syntax, text in ((HERMES, hermes), (DEEPSEEK, deepseek)):
        result = _parse(syntax, text, 2)
        assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_weather", {"days": 2})]
        assert result.content == "Hi" and result.errors == ()


def test_text_that_is_not_a_call_stays_text():
    result = _parse(LLAMA, "\u00a0hello {}", 1)
    assert result.content == "\u00a0hello {}" and result.tool_calls == ()

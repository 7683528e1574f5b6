"""Long runs of whitespace held undecided: trailing whitespace that may lead a JSON block opener, an
answer that may still start with a JSON call (no opener), leading whitespace before a think tag that
may open, whitespace after a tag tool block. Each held run used to be joined again and searched or
stripped on every feed: quadratic, 7-16 s for 200k characters fed one at a time on a 2-core machine,
0.2-0.7 s now (measured, not asserted: no timing assertions in tests). Every case must parse the
same fed one character at a time, in random pieces, or whole."""

from __future__ import annotations

import random
from typing import NamedTuple

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.decoding.syntax import JsonCallSyntax, OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T
from helios.frontend.parsers import (
    AnswerMode, OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters,
)

from .golden import FILLER_ID, check_stream_invariants, run
from .tools import TOOLS

SYNTAXES = {
    "hermes": OutputSyntax(R.THINK_TAGS, T.JSON_CALLS, S.example_think_tags(), S.example_hermes()),
    "llama": OutputSyntax(R.NONE, T.JSON_CALLS, tools=JsonCallSyntax(name_key="name", arguments_key="parameters")),
    "think": OutputSyntax(R.THINK_TAGS, T.NONE, S.example_think_tags()),
    "qwen-coder": OutputSyntax(R.THINK_TAGS, T.QWEN_CODER_FUNCTIONS, S.example_think_tags("<tool_call>"),
                               S.example_qwen_coder()),
}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>'
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "P"}}'
QWEN_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n</function>\n</tool_call>"


def parse(name: str, text: str, size: int, start: ReasoningState = ReasoningState.CLOSED,
          answer: AnswerMode = AnswerMode.FREE, rng: random.Random | None = None):
    """`text` in pieces of `size` characters (random sizes up to `size` with `rng`)."""
    pipeline = OutputPipeline.create(SYNTAXES[name], TokenDelimiters({}),
                                     OutputRequest(TOOLS, "c", OutputStart(start), answer))
    feeds, at = [], 0
    while at < len(text):
        step = rng.randint(0, size) if rng else size
        feeds.append((FILLER_ID, text[at : at + step]))
        at += step
    outcome = run(pipeline, feeds)
    check_stream_invariants(outcome.events, outcome.result, "c")
    return outcome.result


def spaces(n: int) -> str:
    return (" \n\t " * n)[:n]


class Case(NamedTuple):
    """``WS`` in the texts stands for the whitespace run."""

    syntax: str
    text: str
    content: str
    markup: str = ""  # a part of the dropped markup
    calls: tuple[str, ...] = ()
    reasoning: str = ""
    start: ReasoningState = ReasoningState.CLOSED
    answer: AnswerMode = AnswerMode.FREE


CASES = {
    "json trailing whitespace": Case("hermes", "hello WS", "hello WS"),
    "json whitespace then a block": Case("hermes", "helloWS" + HERMES_CALL + "WS", "helloWS", "WS<tool_call>",
                                         ("get_weather",)),
    "structured json whitespace then a block": Case("hermes", "WS" + HERMES_CALL, "", "WS<tool_call>", ("get_weather",),
                                                    answer=AnswerMode.STRUCTURED),
    "llama whitespace then a call": Case("llama", "WS" + LLAMA_CALL, "", "WS{", ("get_weather",)),
    "llama whitespace then text": Case("llama", "WS not a call", "WS not a call"),
    "whitespace before think": Case("think", "WS<think>\nr\n</think>\n\nanswer", "answer", "WS<think>", reasoning="r",
                                    start=ReasoningState.UNOPENED),
    "whitespace then no think": Case("think", "WS<thin answer", "WS<thin answer", start=ReasoningState.UNOPENED),
    "tag tool whitespace after a block": Case("qwen-coder", QWEN_CALL + "WS", "", "</tool_call>WS", ("get_weather",)),
    "tag tool whitespace then text": Case("qwen-coder", QWEN_CALL + "WSdone", "WSdone", "</tool_call>",
                                          ("get_weather",)),
}


def parse_case(case: Case, ws: str, size: int, rng: random.Random | None = None):
    result = parse(case.syntax, case.text.replace("WS", ws), size, case.start, case.answer, rng)
    assert result.content == case.content.replace("WS", ws) and result.reasoning == case.reasoning
    assert case.markup.replace("WS", ws) in result.markup
    assert tuple(call.name for call in result.tool_calls) == case.calls and not result.errors
    return result


@pytest.mark.parametrize("name", CASES)
def test_long_whitespace_fed_one_character_at_a_time(name):
    ws = spaces(100_000)
    assert parse_case(CASES[name], ws, 1) == parse_case(CASES[name], ws, 10**6)


@pytest.mark.parametrize("name", CASES)
def test_mixed_whitespace_in_random_pieces(name):
    """Unicode whitespace too (str.isspace decides), and openers split across feeds anywhere."""
    rng = random.Random(name)
    # A Llama block's body is JSON, where only JSON whitespace may precede the call (other
    # whitespace there makes it malformed, as before).
    alphabet = " \n\t\r" if name == "llama whitespace then a call" else " \n\t\r\u3000\x85\x1c\u2028"
    for n in (0, 1, 3, 40):
        ws = "".join(rng.choice(alphabet) for _ in range(n))
        whole = parse_case(CASES[name], ws, 10**6)
        for size in (1, 2, 5, 13):
            assert parse_case(CASES[name], ws, size, rng) == whole

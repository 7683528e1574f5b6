"""The harmony frames grammar's shape and its refusals (the served behaviour is in test_families)."""

from __future__ import annotations

import pytest

from helios.frontend.structured.grammar import GrammarError
from helios.frontend.structured.grammar_channels import channels_lark
from helios.frontend.structured.grammar_lark import Speller
from helios.frontend.structured.grammar_tools import AnswerKind, CallPolicy, ToolSchema
from helios.frontend.parsers import FramePosition, FrameStart, TokenDelimiters
from helios.frontend.decoding.syntax import example_harmony

CHANNELS = example_harmony()
IDS = {control: 500 + i for i, control in enumerate(CHANNELS.controls)}
SPELLER = Speller(lambda text: ([1] * len(text), [(i, i + 1) for i in range(len(text))]), lambda _: True,
                  TokenDelimiters(IDS))
TOOL = ToolSchema.from_openai([{"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {}}}}])
HEADER = FrameStart(FramePosition.HEADER, header_text="assistant")


def test_a_forced_call_is_one_frame_to_the_function_after_a_bounded_reasoning_frame():
    lark = channels_lark(CHANNELS, SPELLER, HEADER, CallPolicy(TOOL, AnswerKind.NONE, True), AnswerKind.NONE, {}, 64)
    assert f'<[{IDS["<|channel|>"]}]> "commentary to=functions.get_time " <[{IDS["<|constrain|>"]}]> "json"' in lark
    assert "max_tokens=64" in lark and "@answer" not in lark
    assert lark.splitlines()[0].startswith("start: final_")  # the prompt's header is continued


def test_a_structured_answer_is_the_final_channel():
    lark = channels_lark(CHANNELS, SPELLER, FrameStart(), None, AnswerKind.STRUCTURED, {})
    assert f'"final" <[{IDS["<|message|>"]}]> @answer' in lark
    assert lark.splitlines()[0].startswith(f"start: <[{IDS['<|start|>']}]> frames_")


@pytest.mark.parametrize("start", [FrameStart(FramePosition.BODY, recipient="assistant<|channel|>analysis"),
                                   FrameStart(FramePosition.HEADER, header_text="assistant<|channel|>final")])
def test_an_open_body_or_a_longer_header_cannot_be_continued(start):
    with pytest.raises(GrammarError, match="cannot continue"):
        channels_lark(CHANNELS, SPELLER, start, None, AnswerKind.STRUCTURED, {})

"""Harmony headers that name a tool recipient but no channel: a call, as harmony's own parser (and
vLLM, which uses it) reads them, since the channel is optional there and the recipient alone makes a
message a function call. Before, such a header was `MALFORMED_HEADER` and the call's body dropped."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import FrameStart, OutputPipeline, OutputRequest, OutputStart

from .golden import Call, Expect, check_golden, delimiters_for, detokenize, encode
from .test_harmony import SYNTAX
from .tools import TOOLS

CASES = {
    "recipient_without_a_channel": (
        ['<|start|>assistant to=functions.get_weather<|message|>{"city": "Paris"}<|call|>'],
        Expect("", "", (Call("get_weather", {"city": "Paris"}),)),
    ),
    "recipient_and_content_type_without_a_channel": (
        ["<|start|>assistant<|channel|>analysis<|message|>Look.<|end|>",
         '<|start|>assistant to=functions.get_weather <|constrain|>json<|message|>{"days": 3}'],
        Expect("Look.", "", (Call("get_weather", {"days": 3}),)),
    ),
    "neither_a_channel_nor_a_recipient_stays_malformed": (
        ["<|start|>assistant<|message|>lost<|end|>"], Expect("", "", errors=(K.MALFORMED_HEADER,)),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_tool_recipient_makes_a_call_without_a_channel(harmony_tokenizer, name):
    delimiters = delimiters_for(harmony_tokenizer, SYNTAX.delimiter_spellings())
    segments, expect = CASES[name]
    stream = detokenize(harmony_tokenizer, encode(harmony_tokenizer, segments))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(frame=FrameStart())))
    check_golden(make, stream, delimiters, expect, seed=name)

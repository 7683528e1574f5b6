"""Hostile generations: JSON nested past the recursion limit, non-JSON numbers, escaped lone
surrogates and long outputs fed one character at a time. Parsers never raise, and every call's
arguments are strict JSON text that can be sent as UTF-8."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.decoding.syntax import JsonCallSyntax, OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters

from .golden import check_stream_invariants, control_feeds, run
from .tools import TOOLS

DS = "｜DSML｜"
HARMONY_IDS = {control: 1 + n for n, control in enumerate(S.example_harmony().controls)}
SYNTAXES = {
    "hermes": OutputSyntax(R.THINK_TAGS, T.JSON_CALLS, S.example_think_tags(), S.example_hermes()),
    "mistral": OutputSyntax(R.NONE, T.JSON_CALLS, tools=JsonCallSyntax("[TOOL_CALLS]", name_key="name",
                                                                       arguments_key="arguments")),
    "llama": OutputSyntax(R.NONE, T.JSON_CALLS, tools=JsonCallSyntax(name_key="name", arguments_key="parameters")),
    "deepseek-v3": OutputSyntax(R.NONE, T.JSON_CALLS, tools=S.example_deepseek_v3()),
    "dsml": OutputSyntax(R.THINK_TAGS, T.DSML, S.example_think_tags(f"<{DS}function_calls>"), S.example_dsml()),
    "glm": OutputSyntax(R.THINK_TAGS, T.GLM_ARGUMENTS, S.example_think_tags(), S.example_glm_arguments()),
    "harmony": OutputSyntax(R.HARMONY_CHANNELS, T.HARMONY_CHANNELS, channels=S.example_harmony()),
}
CALLS = {  # each syntax's spelling of a get_weather call whose arguments object is ARGS
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": ARGS}\n</tool_call>',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": ARGS}]',
    "llama": '{"name": "get_weather", "parameters": ARGS}',
    "deepseek-v3": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\nARGS\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "harmony": "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>ARGS<|call|>",
}


def feeds_of(name: str, text: str, size: int) -> list[tuple[int, str]]:
    """Harmony controls as their tokens; all other text in pieces of `size` characters."""
    return control_feeds(HARMONY_IDS if name == "harmony" else {}, text, size)


def parse(name: str, text: str, size: int = 1):
    delimiters = TokenDelimiters(HARMONY_IDS if name == "harmony" else {})
    pipeline = OutputPipeline.create(SYNTAXES[name], delimiters,
                                     OutputRequest(TOOLS, "c", OutputStart(ReasoningState.CLOSED)))
    outcome = run(pipeline, feeds_of(name, text, size))
    check_stream_invariants(outcome.events, outcome.result, "c")
    return outcome.result


def strict_json(text: str) -> object:
    """`text` as strict JSON (no NaN or Infinity) that encodes to UTF-8."""
    text.encode("utf-8")
    return json.loads(text, parse_constant=lambda constant: pytest.fail(f"{constant} in {text!r}"))


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("args", ['{"options": ' + "[" * 5_000 + "]" * 5_000 + "}",
                                  '{"ratio": NaN}', '{"ratio": -Infinity}', '{"ratio": 1e999}'])
def test_arguments_that_are_not_json_are_malformed(name, args):
    """Nesting past the recursion limit raised RecursionError out of `feed`/`finish`; NaN, Infinity
    and 1e999 (read as inf) were sent as `NaN`/`Infinity`, arguments no client's JSON parser reads."""
    for size in (1, 7, 10**6):
        result = parse(name, CALLS[name].replace("ARGS", args), size)
        assert K.MALFORMED_CALL in [error.kind for error in result.errors]
        for call in result.tool_calls:  # harmony ends the started call with `{}`
            assert strict_json(call.arguments) == {} and not call.complete


@pytest.mark.parametrize("name, text", [
    *((name, call.replace("ARGS", '{"city": "a\\ud800b", "tags": ["\\udc00"]}')) for name, call in CALLS.items()),
    ("dsml", f'<{DS}function_calls>\n<{DS}invoke name="get_weather">\n<{DS}parameter name="tags" string="false">'
             f'["a\\ud800b", "\\udc00"]</{DS}parameter>\n</{DS}invoke>\n</{DS}function_calls>'),
])
def test_escaped_lone_surrogates_stay_escaped(name, text):
    """JSON may escape a lone surrogate; decoded and written back unescaped, the arguments could
    not be encoded as UTF-8 for the response."""
    (call,) = parse(name, text).tool_calls
    arguments = strict_json(call.arguments)
    assert arguments.get("tags")[-1] == "\udc00" and arguments.get("city", "a\ud800b") == "a\ud800b"


@pytest.mark.parametrize("name, text", [
    ("hermes", CALLS["hermes"].replace("ARGS", '{"city": "' + "x" * 100_000 + '"}')),
    ("deepseek-v3", CALLS["deepseek-v3"].replace("ARGS", '{"city": "' + "x" * 100_000 + '"}')),
    ("glm", "<tool_call>" + "\n" * 50_000 + "get_weather\n<arg_key>city</arg_key><arg_value>P</arg_value></tool_call>"),
])
def test_long_outputs_fed_one_character_at_a_time_parse_whole(name, text):
    """A JSON call block was joined and searched for its closer on every feed, and GLM's newlines
    before a call's name were joined at every newline: quadratic, about 26 s and 100 s for these on
    a 2-core machine, 0.5-1 s now (measured, not asserted: no timing assertions in tests)."""
    result = parse(name, text)
    assert [call.name for call in result.tool_calls] == ["get_weather"] and not result.errors


@pytest.mark.parametrize("name, text", [
    ("llama", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("hermes", '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n</tool_call>'),
])
def test_arguments_under_the_other_common_key_are_kept(name, text):
    """Llama's syntax reads "parameters" and Hermes' "arguments"; a call written with the other key
    was a call with empty arguments, its arguments silently dropped."""
    (call,) = parse(name, text, size=3).tool_calls
    assert strict_json(call.arguments) == {"city": "Paris"}


def test_a_separator_that_is_no_whitespace_before_a_name_stays_in_the_name():
    """The linear-time change to GLM's separators before a name first dropped any separator there;
    one that is not whitespace starts the name's text, as it always did (so this name is unknown)."""
    glm = dataclasses.replace(S.example_glm_arguments(), name_separator="<sep>")
    SYNTAXES["glm-sep"] = OutputSyntax(R.NONE, T.GLM_ARGUMENTS, tools=glm)
    try:
        for text, name in (("<tool_call><sep>get_weather</tool_call>", "<sep>get_weather"),
                           ("<tool_call><sep>get_weather<sep><arg_key>city</arg_key><arg_value>P</arg_value>"
                            "</tool_call>", "<sep>get_weather<sep>")):
            one, whole = parse("glm-sep", text), parse("glm-sep", text, size=len(text))
            assert one == whole and not one.tool_calls
            assert [(e.kind, e.detail) for e in one.errors] == [(K.UNKNOWN_TOOL, name)]
    finally:
        del SYNTAXES["glm-sep"]

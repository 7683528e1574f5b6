"""Tag tool parsers read what chat templates write: values are unescaped text.

(The round trips of every family's template are added below in a later change.)
"""

from __future__ import annotations

import json
import random

import pytest

from helios.frontend.decoding.events import ParseErrorKind
from helios.frontend.decoding.syntax import (
    OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind, example_glm_arguments, example_qwen_coder,
)
from helios.frontend.parsers import OutputPipeline, OutputRequest, TokenDelimiters, ToolRegistry

from .golden import FILLER_ID, random_chunks, run

# --- the parser behaviour the round trips rely on, on one syntax at a time -------------------------

QWEN_CODER = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.QWEN_CODER_FUNCTIONS, tools=example_qwen_coder())
GLM = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.GLM_ARGUMENTS, tools=example_glm_arguments())
STRINGS = ToolRegistry.from_openai([{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "n": {"type": "integer"}}}}}])


def qwen_coder_call(*params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def glm_call(*params: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n" for key, value in params)
    return f"<tool_call>f\n{body}</tool_call>"


def parse_in_chunks(syntax: OutputSyntax, text: str, seed: int):
    """The result of `text` fed whole, checked equal for one character a feed and random chunks."""
    delimiters = TokenDelimiters({})
    make = lambda: OutputPipeline.create(syntax, delimiters, OutputRequest(STRINGS, "c"))
    whole = run(make(), [(FILLER_ID, text)]).result
    rng = random.Random(seed)
    for feeds in [[(FILLER_ID, c) for c in text]] + [random_chunks([(FILLER_ID, text)], delimiters, rng) for _ in range(5)]:
        assert run(make(), feeds).result == whole, feeds
    return whole


@pytest.mark.parametrize("syntax, call", [(QWEN_CODER, qwen_coder_call), (GLM, glm_call)], ids=["qwen-coder", "glm"])
@pytest.mark.parametrize("value", ["x</parameter>y", "</parameter>", "a</arg_value>b", "</arg_value>\n\nz",
                                   "<arg_value>c</arg_value>", "</parameter>\n</parameter>"])
def test_a_value_closer_before_other_text_is_value_text(syntax, call, value):
    """Templates write values unescaped: a closer followed by anything but a tag that may follow a
    value is part of the value (it used to end the value and drop the rest as unexpected text)."""
    result = parse_in_chunks(syntax, call(("a", value), ("n", "3")), seed=len(value))
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("f", {"a": value, "n": 3})]
    assert result.errors == () and result.content == ""


@pytest.mark.parametrize("syntax, call", [(QWEN_CODER, qwen_coder_call), (GLM, glm_call)], ids=["qwen-coder", "glm"])
def test_a_repeated_parameter_keeps_its_first_value(syntax, call):
    """Arguments JSON never holds a key twice: a repeated parameter's value is dropped with an error
    (the first value has been streamed already)."""
    result = parse_in_chunks(syntax, call(("a", "one"), ("b", "two"), ("a", "three"), ("n", "4"), ("n", "5")), seed=3)
    assert [c.arguments for c in result.tool_calls] == ['{"a": "one", "b": "two", "n": 4}']
    assert [(e.kind, e.detail) for e in result.errors] == [
        (ParseErrorKind.MALFORMED_CALL, "f.a: repeated parameter"), (ParseErrorKind.MALFORMED_CALL, "f.n: repeated parameter")]
    assert "three" in result.markup and "5" in result.markup

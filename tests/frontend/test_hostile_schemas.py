"""Hostile client schemas on the structured-output and tool-call grammar path: each either compiles
to a grammar that holds the value to its syntax, or is refused before admission with a typed 400
(`GrammarError`, `SchemaRefError`, ...) naming the request field at fault; never an internal error,
a fetch, a hang or a memory blow-up. Memory is bounded by tracemalloc peaks, never by time."""

from __future__ import annotations

import pytest

from helios.frontend.structured.grammar_lark import not_containing
from helios.frontend.structured.grammar_values import safe_schema

from .served import ids_of
from .test_grammar_tools import accepts, chat, plain_ids, served, tool  # noqa: F401

# -- JSON values keep the value closer out of their own string constraints ------------------------

PATTERNED = {"type": "object", "properties": {
    "a": {"type": "array", "items": {"type": "string", "pattern": "^.*$"}},
    "o": {"type": "object", "properties": {"s": {"type": "string", "format": "no-such-format"},
                                           "t": {"type": ["string", "null"], "pattern": "^x"}}},
}}


def test_a_json_string_pattern_is_intersected_with_the_value_closer_rule(served):
    """A string's own ``pattern`` (or ``format``, which llguidance may ignore) replaced the rule that
    keeps the value closer out of JSON strings: ``".*"`` let a Qwen value write ``</parameter>``
    inside a string and end the parameter early."""
    case = served["qwen"]
    prepared = case.model.prepare_chat(chat(case, tools=[tool(PATTERNED)], tool_choice="required"))
    head = ids_of(case.tokenizer, "</think>", "<tool_call>", "\n<function=f>\n<parameter=a>\n")
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["x </p> y"]\n</parameter>\n'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["x</parameter>'))
    head = ids_of(case.tokenizer, "</think>", "<tool_call>", "\n<function=f>\n<parameter=o>\n")
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"s": "a", "t": "xy"}\n</parameter>\n'))
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"t": null}\n</parameter>\n'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"s": "a</parameter>'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"t": "x</parameter>'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"t": "y'))  # the pattern still holds


def test_escaped_json_strings_keep_entities_under_their_own_pattern(served):
    case = served["xtml"]
    prepared = case.model.prepare_chat(chat(case, tools=[tool(PATTERNED)], tool_choice="required"))
    head = ids_of(case.tokenizer, '<xtml:calls>\n<xtml:call name="f">\n<xtml:arg name="a">')
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["a &lt; b"]'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["a <'))


def test_safe_schema_adds_the_closer_rule_beside_string_constraints():
    pattern = f"^{not_containing('</v>')}$"
    safe = safe_schema({"type": "string", "pattern": "^a", "allOf": [{"type": "string", "maxLength": 9}]}, pattern)
    assert safe["pattern"] == "^a"
    assert safe["allOf"] == [{"type": "string", "maxLength": 9, "pattern": pattern}, {"pattern": pattern}]
    assert safe_schema({"enum": ["a", 1]}, pattern)["allOf"] == [{"pattern": pattern}]
    assert "allOf" not in safe_schema({"enum": [1, 2]}, pattern)
    assert safe_schema({"type": "string"}, pattern) == {"type": "string", "pattern": pattern}

"""Number ranges llguidance writes wrongly (`helios.frontend.structured.grammar_bounds`): a range whose
exclusive bound is an integer sharing its integer part with the other bound let that integer through
(``{"exclusiveMinimum": 0, "maximum": 0.5}`` wrote ``0``); such a schema is now a 400 naming the
keyword, and every range that compiles admits only numbers inside it."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal

import pytest

from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, GrammarKind, GrammarRequest, shape_error

from .test_grammar_tools import chat, served, tool  # noqa: F401

EOS = 1
BOUNDS = [-1.5, -1, -0.5, 0, 0.05, 0.5, 1, 1.5, 10, 10.5]
NUMBERS = ["-1.5", "-1.25", "-1", "-0.5", "-0.25", "-0", "0", "0.01", "0.05", "0.25", "0.5", "0.75", "1", "1.25",
           "1.5", "2", "10", "10.25", "10.5", "11"]


@pytest.fixture(scope="module")
def compiler(deepseek_tokenizer):
    return GrammarCompiler.from_tokenizer(deepseek_tokenizer, vocab_size=deepseek_tokenizer.get_vocab_size(),
                                          eos_token_ids=[EOS])


def request(schema: dict) -> GrammarRequest:
    return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))


def inside(number: Decimal, schema: dict) -> bool:
    low, high = schema.get("minimum"), schema.get("maximum")
    low_x, high_x = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    return ((low is None or number >= Decimal(str(low))) and (low_x is None or number > Decimal(str(low_x)))
            and (high is None or number <= Decimal(str(high))) and (high_x is None or number < Decimal(str(high_x))))


def test_compiled_number_ranges_admit_only_numbers_inside_them(compiler, deepseek_tokenizer):
    """Every bound pair (inclusive or exclusive) over integers and fractions near zero, ten and
    below zero: a range that compiles never takes a number outside it (before: 14 pairs took the
    exclusive integer bound itself, ``0``, ``-0``, ``1``, ``10`` or ``-1``)."""
    outside = []
    for low, high in itertools.combinations(BOUNDS, 2):
        for low_key, high_key in itertools.product(("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            schema = {"type": "number", low_key: low, high_key: high}
            try:
                matcher = compiler.compile(request(schema))
            except GrammarError:
                continue
            for text in NUMBERS:
                probe = matcher.fork()
                ids = deepseek_tokenizer.encode(text, add_special_tokens=False).ids
                if all(probe.consume_token(i) for i in ids) and probe.is_accepting and not inside(Decimal(text), schema):
                    outside.append((schema, text))
    assert outside == []


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, "exclusiveMinimum 0 at / with maximum 0.5"),
    ({"type": "number", "exclusiveMinimum": 10, "exclusiveMaximum": 10.5}, "exclusiveMinimum 10 at /"),
    ({"type": "number", "minimum": -0.5, "exclusiveMaximum": 0}, "exclusiveMaximum 0 at / with minimum -0.5"),
    ({"type": "number", "exclusiveMinimum": -1.5, "exclusiveMaximum": -1}, "exclusiveMaximum -1 at /"),
    ({"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 0.001}, "exclusiveMinimum 0 at /"),
    ({"$defs": {"p": {"exclusiveMinimum": 0}}, "type": "number", "$ref": "#/$defs/p", "maximum": 0.5},
     "exclusiveMinimum 0 at /\\$defs/p with maximum 0.5 at /"),
    ({"type": "object", "properties": {"a": {"type": "number", "exclusiveMinimum": 0}},
      "allOf": [{"properties": {"a": {"maximum": 0.5}}}]}, "exclusiveMinimum 0 at /properties/a with maximum 0.5 at /allOf/0"),
    ({"type": "number", "exclusiveMinimum": 0, "anyOf": [{"type": "string"}, {"maximum": 0.5}]},
     "exclusiveMinimum 0 at / with maximum 0.5 at /anyOf/1"),
    ({"type": "array", "items": {"type": "number", "exclusiveMinimum": 5, "exclusiveMaximum": 5.5, "multipleOf": 0.25}},
     "exclusiveMinimum 5 at /items"),
])
def test_a_range_llguidance_writes_wrongly_is_refused_naming_its_keyword(schema, keyword):
    assert shape_error(request(schema)).startswith(keyword.replace("\\", ""))


def draft4(low: float, low_exclusive: bool, high: float, high_exclusive: bool) -> dict:
    """A number range in draft 4's spelling: boolean exclusiveMinimum/exclusiveMaximum beside the bounds."""
    return {"type": "number", "minimum": low, "exclusiveMinimum": low_exclusive, "maximum": high,
            "exclusiveMaximum": high_exclusive}


def test_draft4_exclusive_ranges_admit_only_numbers_inside_them(compiler, deepseek_tokenizer):
    """Draft 4's boolean ``exclusiveMinimum: true`` makes ``minimum`` exclusive, and llguidance
    honours it, writing the same ranges wrongly: ``{"minimum": 0, "exclusiveMinimum": true,
    "maximum": 0.5}`` took ``0``, as the check looked only at numeric exclusive bounds."""
    outside = []
    for low, high in itertools.combinations(BOUNDS, 2):
        for low_x, high_x in itertools.product((False, True), repeat=2):
            schema = draft4(low, low_x, high, high_x)
            try:
                matcher = compiler.compile(request(schema))
            except GrammarError:
                continue
            for text in NUMBERS:
                number, probe = Decimal(text), matcher.fork()
                ids = deepseek_tokenizer.encode(text, add_special_tokens=False).ids
                is_inside = (number > Decimal(str(low)) if low_x else number >= Decimal(str(low))) and (
                    number < Decimal(str(high)) if high_x else number <= Decimal(str(high)))
                if all(probe.consume_token(i) for i in ids) and probe.is_accepting and not is_inside:
                    outside.append((schema, text))
    assert outside == []


@pytest.mark.parametrize("schema, keyword", [
    (draft4(0, True, 0.5, False), "minimum (with exclusiveMinimum true) 0 at / with maximum 0.5"),
    (draft4(-0.5, False, 0, True), "maximum (with exclusiveMaximum true) 0 at / with minimum -0.5"),
    ({"type": "object", "properties": {"a": {"type": "number", "minimum": 10, "exclusiveMinimum": True,
                                             "exclusiveMaximum": 10.5}}},
     "minimum (with exclusiveMinimum true) 10 at /properties/a"),
])
def test_a_draft4_exclusive_range_llguidance_writes_wrongly_is_refused_naming_its_keywords(schema, keyword):
    assert shape_error(request(schema)).startswith(keyword)
    assert shape_error(request(draft4(0, True, 2, False))) == ""  # its integer bound is more than 1 away


@pytest.mark.parametrize("schema", [
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    {"type": "number", "exclusiveMinimum": 0},
    {"type": "number", "minimum": 0, "maximum": 0.5},
    {"type": "number", "exclusiveMinimum": -0.5, "maximum": 0},
    {"type": "number", "exclusiveMinimum": 4.5, "exclusiveMaximum": 5},
    {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 0},
    {"type": "integer", "exclusiveMinimum": 0, "maximum": 1.5},
    {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "number", "maximum": 0.5}]},
    {"type": "object", "properties": {"n": {"$ref": "#"}, "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 2}}},
])
def test_ranges_llguidance_writes_exactly_pass(schema):
    assert shape_error(request(schema)) == ""


def test_the_refusal_is_a_400_naming_the_request_field(served):
    case = served["qwen"]
    schema = {"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}},
              "required": ["p"]}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(GrammarError, match="exclusiveMinimum 0 at /properties/p") as caught:
        case.model.prepare_chat(chat(case, response_format=rf))
    assert (caught.value.http_status, caught.value.param) == (400, "response_format")
    with pytest.raises(GrammarError, match="tool 'f' parameters: .*exclusiveMinimum 0") as caught:
        case.model.prepare_chat(chat(case, tools=[tool(schema)], tool_choice="required"))
    assert (caught.value.http_status, caught.value.param) == (400, "tools[0].function.parameters")


def test_a_walk_past_the_recursion_limit_passes_the_schema_instead_of_raising():
    """Cycles of $refs whose lengths share no factor make a new merged set at every level: the walk
    raised RecursionError out of the shape check (a 500 for a valid schema)."""
    defs, starts = {}, []
    for length in (2, 3, 5, 7, 11):
        for i in range(length):
            defs[f"c{length}_{i}"] = {"type": "object",
                                      "properties": {"x": {"$ref": f"#/$defs/c{length}_{(i + 1) % length}"}}}
        starts.append({"$ref": f"#/$defs/c{length}_0"})
    schema = {"$defs": defs, "type": "object", "properties": {"x": {"allOf": starts}}}
    assert shape_error(request(schema)) == ""

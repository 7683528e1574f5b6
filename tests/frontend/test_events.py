"""Parser event records and the `ResultBuilder` fold."""

from __future__ import annotations

import dataclasses

import pytest

from helios.frontend.decoding.events import (
    ContentDelta,
    MarkupDropped,
    ParseError,
    ParseErrorKind,
    ParseResult,
    ReasoningDelta,
    ResultBuilder,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)


def test_fold_concatenates_deltas_and_orders_calls_by_index():
    builder = ResultBuilder()
    builder.apply([
        ReasoningDelta("th"), ContentDelta("Hel"), ToolCallStart(0, "call_0", "f"), ReasoningDelta("ink"),
        ToolCallArguments(0, '{"a": '), MarkupDropped("<x>"), ToolCallStart(1, "call_1", "g"),
        ToolCallArguments(1, "{}"), ToolCallEnd(1, True), ToolCallArguments(0, "1}"), ToolCallEnd(0, False),
        ParseError(ParseErrorKind.UNTERMINATED_CALL, "f"), ContentDelta("lo"),
    ])
    assert builder.result() == ParseResult(
        reasoning="think",
        content="Hello",
        tool_calls=(ToolCall(0, "call_0", "f", '{"a": 1}', False), ToolCall(1, "call_1", "g", "{}", True)),
        errors=(ParseError(ParseErrorKind.UNTERMINATED_CALL, "f"),),
        markup="<x>",
    )


def test_fold_of_nothing_is_empty():
    assert ResultBuilder().result() == ParseResult("", "", (), (), "")


def test_a_call_starts_once():
    builder = ResultBuilder()
    builder.apply([ToolCallStart(0, "a", "f")])
    with pytest.raises(ValueError):
        builder.apply([ToolCallStart(0, "b", "f")])


def test_arguments_need_a_started_call_and_events_must_be_events():
    with pytest.raises(KeyError):
        ResultBuilder().apply([ToolCallArguments(3, "{}")])
    with pytest.raises(TypeError):
        ResultBuilder().apply(["text"])


def test_events_are_immutable_values():
    event = ToolCallStart(0, "call_0", "f")
    assert event == ToolCallStart(0, "call_0", "f") and hash(event) == hash(ToolCallStart(0, "call_0", "f"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.name = "g"
    assert {kind.value for kind in ParseErrorKind} >= {"unknown_tool", "invalid_value", "unterminated_call"}

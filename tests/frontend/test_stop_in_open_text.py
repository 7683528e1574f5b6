"""A stop string takes effect on the token whose text completes it, also where that text is held by
the detokenizer behind an open character (a token holding part of a UTF-8 character after it, or a
run of stray bytes, which keeps the pending text ending in U+FFFD).

The stop matcher saw only the detokenizer's deltas, and a pending text ending in U+FFFD is no delta
until the open character completes or a run of stray bytes is settled: ``STOP`` then twenty stray
bytes with the stop ``P\\ufffd`` (or ``\\ufffd``) was found only at the output's end, every token
after it generated and counted. Now the part of the pending text that no later id changes (all of it
but the open character, and that too once it is found a stray byte) is matched as it becomes known.

Checked on the fuzz's tokenizers with outputs biased toward byte tokens and stops around U+FFFD:
the output stops on the first token at which the known text holds a stop (`_known`: on byte-level
tokenizers the decode of the ids so far, without its last U+FFFD where their bytes leave a
character open; on byte-fallback ones the decode of the ids before an open run of byte tokens), and
what it returns (text, log-probability entries, usage, finish reason) is what feeding exactly the
ids up to that token returns.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer
from helios.frontend.decoding.observation import ObservationOptions
from helios.frontend.decoding.stops import StopOptions
from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
from helios.frontend.responses.output import OutputProcessor
from helios.runtime.records.events import FinishReason

from .test_detokenize_fuzz import (  # noqa: F401 (case: the fuzz's tokenizers, a fixture)
    EMBEDDED, FUZZ, Case, Run, _byte_level, _known, _reference_stop, _stop_strings, case,
)
from .test_stray_bytes import DECODES_PER_ID, CountingDecoder
from .test_stream_text_parity import _draw_ids

STRAY = 104  # the embedded tokenizer's lone byte 0xA5
EURO_LEAD = 0xE2  # the first of the three bytes of "€" (E2 82 AC)


def _stops_around_fffd(data, whole: str) -> tuple[str, ...]:
    """Pieces of `whole` that end at or just after one of its U+FFFD, or the character itself."""
    marks = [at for at, char in enumerate(whole) if char == REPLACEMENT_CHAR]
    if not marks:
        return ()
    at = data.draw(st.sampled_from(marks)) + data.draw(st.integers(0, 1))
    start = max(0, at - data.draw(st.integers(0, 4)))
    return tuple(stop for stop in (whole[start:at + 1], REPLACEMENT_CHAR) if stop)


def _same_output(run: Run, on_time: Run) -> None:
    assert run.text == on_time.text
    assert run.final.result.content == on_time.final.result.content
    assert run.final.logprobs == on_time.final.logprobs
    assert run.final.usage == on_time.final.usage
    assert run.final.reason == on_time.final.reason


@FUZZ
@given(data=st.data())
def test_a_stop_takes_effect_once_its_text_is_known(case, data):  # noqa: F811 (the fuzz's fixture)
    ids = _draw_ids(case, data)
    whole = case.tokenizer.decode(ids, skip_special_tokens=False)
    stops = data.draw(st.sampled_from(["pieces", "fffd"]))
    strings = _stop_strings(data, case, whole) if stops == "pieces" else _stops_around_fffd(data, whole)
    if not strings:
        return
    options = StopOptions(strings=strings[:4])
    run = Run(case, ids, options, FinishReason.LENGTH)
    cut = _reference_stop(whole, options.strings)
    assert run.text == (whole if cut is None else whole[:cut])
    on_time = next((k for k in range(1, len(ids) + 1)
                    if _reference_stop(_known(case, ids[:k]), options.strings) is not None), None)
    assert run.stopped_at == on_time
    if run.stopped_at is not None:
        _same_output(run, Run(case, ids[:run.stopped_at], options, FinishReason.LENGTH))


def _embedded() -> Case:
    return _byte_level(Tokenizer.from_file(str(EMBEDDED)))


def test_a_stop_before_a_run_of_stray_bytes_stops_on_its_token():
    spec = _embedded()
    text_ids = spec.tokenizer.encode("say STOP", add_special_tokens=False).ids
    for stops in (("P" + REPLACEMENT_CHAR,), (REPLACEMENT_CHAR,), ("STOP" + REPLACEMENT_CHAR * 3,)):
        ids = text_ids + [STRAY] * 20 + spec.tokenizer.encode("x", add_special_tokens=False).ids
        run = Run(spec, ids, StopOptions(strings=stops), FinishReason.LENGTH)
        needed = len(text_ids) + stops[0].count(REPLACEMENT_CHAR)
        assert run.stopped_at == needed, stops  # found at the end of the output before
        assert run.final.usage.completion_tokens == needed
        _same_output(run, Run(spec, ids[:needed], StopOptions(strings=stops), FinishReason.LENGTH))


def _byte_ids(spec: Case) -> dict[int, int]:
    """Byte -> the id of the token of that byte alone."""
    return {raw[0]: token_id for token_id in range(spec.vocab_size) if len(raw := spec.raw(token_id)) == 1}


def test_a_stop_completed_before_an_open_character_stops_on_its_token():
    """E2 (a lead byte) then F0 (another): the first is a stray byte for good, the second opens a
    character that later bytes continue. The stop ``a\ufffd`` is known at F0's token."""
    spec = _embedded()
    byte_id = _byte_ids(spec)
    ids = [byte_id[ord("a")], byte_id[0xE2], byte_id[0xF0], byte_id[0x90], byte_id[0x80], byte_id[ord("x")]]
    run = Run(spec, ids, StopOptions(strings=("a" + REPLACEMENT_CHAR,)), FinishReason.LENGTH)
    assert run.text == "" and run.stopped_at == 3  # at "x" before, when the text showed
    _same_output(run, Run(spec, ids[:3], StopOptions(strings=("a" + REPLACEMENT_CHAR,)), FinishReason.LENGTH))


def test_an_open_character_is_not_taken_for_a_stray_byte():
    """A held U+FFFD that a later byte completes is no stop: the stop ``\ufffd`` matches nothing in
    "€" split over three tokens, nor in the lead bytes E0, ED, F0 and F4 followed by the continuation
    bytes each allows (one of 0x80 and 0xA0 breaks each of them)."""
    spec = _embedded()
    byte_id = _byte_ids(spec)
    for text in ("€", "\u0800", "\ud7ff", "\U00010000", "\U0010ffff", "\u00a0"):
        ids = [byte_id[b] for b in text.encode()] + [byte_id[ord("!")]]
        run = Run(spec, ids, StopOptions(strings=(REPLACEMENT_CHAR,)), FinishReason.LENGTH)
        assert run.stopped_at is None and run.text == text + "!" and run.final.reason is FinishReason.LENGTH


@pytest.mark.parametrize("stops", [("zz" + REPLACEMENT_CHAR,), ("x" * 40, "y" + REPLACEMENT_CHAR * 2 + "q")])
def test_looking_ahead_in_a_stray_run_decodes_each_id_a_bounded_number_of_times(stops):
    """A run of 4,000 stray bytes that never completes a stop: the held text is looked at as it
    becomes known, each character once, and the ids decoded stay within a constant per id."""
    spec = _embedded()
    counting = CountingDecoder(spec.tokenizer)
    output = OutputProcessor(IncrementalDetokenizer(counting, skip_special_tokens=False), OutputPipeline(PlainText()),
                             StopOptions(strings=stops).new_matcher(), [spec.eos], ObservationOptions(), [1])
    ids = [STRAY] * 4000 + spec.tokenizer.encode("x", add_special_tokens=False).ids
    assert all(not output.feed(token_id).is_stopped for token_id in ids)
    final = output.finish(FinishReason.LENGTH)
    assert final.result.content == REPLACEMENT_CHAR * 4000 + "x"
    assert counting.decoded_ids <= DECODES_PER_ID * len(ids)

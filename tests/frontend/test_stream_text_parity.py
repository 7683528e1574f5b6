"""Streamed text equals the whole decode, whichever way an output ends, and a stop loses no text.

The output path (`OutputProcessor` over `IncrementalDetokenizer`, as a request builds it) is fed
outputs drawn toward what breaks text streaming: byte tokens (byte-fallback ``<0xNN>`` ids of every
byte, bytes spelling a literal U+FFFD, byte-level ids holding part of a character), a literal U+FFFD
token, split characters, spaces, SentencePiece ``▁`` and special tokens, on the six tokenizers of the
detokenize fuzz. Each output ends one way: a stop token, a stop token sequence, EOS, the output limit,
a cancellation, a grammar dead end or a stop string. Checked: the text streamed (every step's events,
then the final record's) equals the non-streamed content (`ParseResult.content`) and the tokenizer's
own ``decode`` of the kept ids (those before EOS or a matched stop sequence; an open character reads
U+FFFD there as it does in the decode); a stop string cuts that decode at the stop completing first.
Log-probability entries are those of the kept ids (up to a stop string's cut) and their
``text_offset`` indexes the returned text in order.

`HELIOS_STREAM_PARITY_EXAMPLES` sets the examples per tokenizer and ending (default 12), for a
bigger sweep outside the suite.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken

from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer
from helios.frontend.decoding.logprobs import text_logprobs
from helios.frontend.decoding.stops import StopOptions
from helios.runtime.records.events import FinishReason

from .test_detokenize_fuzz import (  # noqa: F401 (case: the fuzz's tokenizers, a fixture)
    EOS_TEXTS,
    LLAMA2,
    METASPACE,
    Case,
    Run,
    _check_offsets,
    _is_fallback_byte,
    _reference_stop,
    _sentencepiece,
    _stop_strings,
    case,
)

EXAMPLES = int(os.environ.get("HELIOS_STREAM_PARITY_EXAMPLES", "12"))
SWEEP = settings(max_examples=EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ENDINGS = ["stop_token", "stop_sequence", "eos", "length", "cancelled", "grammar_dead_end", "stop_string"]
REASONS = {"eos": FinishReason.EOS, "length": FinishReason.LENGTH, "cancelled": FinishReason.CANCELLED,
           "grammar_dead_end": FinishReason.GRAMMAR_DEAD_END}
LITERAL = "\ufffd"  # added (not special) to the SentencePiece tokenizers: a literal U+FFFD token


def _byte_ids(spec: Case) -> list[int]:
    """Ids holding bytes alone: every ``<0xNN>`` of a byte-fallback tokenizer, a byte-level one's
    ids holding part of a character."""
    if spec.is_byte_level:
        return spec.partial_ids
    return [spec.tokenizer.token_to_id(f"<0x{byte:02X}>") for byte in range(256)]


def _draw_ids(spec: Case, data) -> list[int]:
    """An output biased toward byte tokens: runs of bytes (U+FFFD spelled in bytes among them), the
    literal U+FFFD token, and the fuzz's mixes of pieces, spaces and special tokens."""
    tokenizer, byte_ids = spec.tokenizer, _byte_ids(spec)
    ids: list[int] = []
    for kind in data.draw(st.lists(st.sampled_from(["bytes", "bytes", "fffd", "mix"]), max_size=6)):
        if kind == "bytes":
            ids += data.draw(st.lists(st.sampled_from(byte_ids), min_size=1, max_size=24))
        elif kind == "fffd":
            ids += tokenizer.encode(LITERAL * data.draw(st.integers(1, 3)), add_special_tokens=False).ids
            literal = tokenizer.token_to_id(LITERAL)
            if literal is not None and data.draw(st.booleans()):
                ids.append(literal)
        else:
            ids += spec.ids(data, 8)
    return [i for i in ids if i != spec.eos]


@pytest.fixture(scope="module")
def parity_case(case) -> Case:  # noqa: F811 (the fuzz's fixture)
    """The fuzz's tokenizer; a SentencePiece one also has a literal U+FFFD token (not special)."""
    if not case.is_byte_level and case.tokenizer.token_to_id(LITERAL) is None:
        case.tokenizer.add_tokens([AddedToken(LITERAL, special=False, normalized=False)])
    return case


def _ending(data, spec: Case, ids: list[int], ending: str):
    """(ids fed, stops, reason the engine reports, ids kept: the text is their decode or None for
    a stop string)."""
    if ending == "stop_token":
        stop = data.draw(st.sampled_from([i for i in spec.special_ids if i != spec.eos]))
        ids = [i for i in ids if i != stop]
        tail = data.draw(st.lists(st.sampled_from(ids or [stop]), max_size=2))
        return ids + [stop] + tail, StopOptions(token_ids=(stop,)), FinishReason.LENGTH, ids
    if ending == "stop_sequence":
        pool = [i for i in _byte_ids(spec) + spec.special_ids if i != spec.eos]  # EOS would end it first
        sequence = tuple(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))
        fed = ids + list(sequence)
        end = next(count for count in range(1, len(fed) + 1) if tuple(fed[:count][-len(sequence):]) == sequence)
        return fed + [ids[0] if ids else spec.eos], StopOptions(token_sequences=(sequence,)), FinishReason.LENGTH, \
            fed[:end - len(sequence)]
    if ending == "eos":
        return ids + [spec.eos, ids[0] if ids else spec.eos], StopOptions(), FinishReason.EOS, ids
    if ending == "stop_string":
        whole = spec.tokenizer.decode(ids, skip_special_tokens=False)
        return ids, StopOptions(strings=_stop_strings(data, spec, whole)), FinishReason.LENGTH, None
    return ids, StopOptions(), REASONS[ending], ids


def _check_spm_offsets(spec: Case, ids: list[int], offsets: list[int], text: str) -> None:
    """Byte fallback: in order, within the text, and a token after a closed run (no byte token
    last, no character open) starts where the text of the tokens before it ends."""
    assert len(offsets) == len(ids)
    assert offsets == sorted(offsets) and all(0 <= offset <= len(text) for offset in offsets)
    for count, offset in enumerate(offsets):
        before = spec.tokenizer.decode(ids[:count], skip_special_tokens=False)
        closed = not count or not _is_fallback_byte(spec.tokenizer, ids[count - 1])
        if closed and not before.endswith(REPLACEMENT_CHAR) and text.startswith(before):
            assert offset == len(before), (count, before)


@pytest.mark.parametrize("ending", ENDINGS)
@SWEEP
@given(data=st.data())
def test_streamed_text_is_the_whole_decode_of_the_kept_ids(parity_case, ending, data):
    spec = parity_case
    ids = _draw_ids(spec, data)
    fed, stops, reason, kept = _ending(data, spec, ids, ending)
    run = Run(spec, fed, stops, reason)
    assert run.text == run.final.result.content  # streamed == non-streamed
    entries = list(run.final.logprobs)
    assert entries[:len(run.step_entries)] == run.step_entries
    if kept is None:  # a stop string cuts the decode at the stop completing first
        whole = spec.tokenizer.decode(ids, skip_special_tokens=False)
        cut = _reference_stop(whole, stops.strings)
        assert run.text == whole[:cut]
        assert run.final.reason == (FinishReason.LENGTH if cut is None else FinishReason.STOP)
        kept = ids[:len(entries)]
    else:
        assert run.text == spec.tokenizer.decode(kept, skip_special_tokens=False)
        assert run.final.reason == (FinishReason.STOP if stops.has_token_stops else reason)
    assert [entry.token_id for entry in entries] == kept
    check = _check_offsets if spec.is_byte_level else _check_spm_offsets
    check(spec, kept, text_logprobs(entries)["text_offset"], run.text)


# --- a stop token loses no text the detokenizer held ------------------------------------------------


@pytest.mark.parametrize("ending", ["stop_token", "stop_sequence", "eos", "length", "cancelled"])
def test_a_stop_token_keeps_the_space_held_with_an_open_character(deepseek_tokenizer, ending):
    """`` \\xf0\\x9f\\x98`` holds a space and the start of an emoji: the detokenizer holds the space
    with the open character, and the next token's delta carries it. A stop token's delta was dropped
    whole, so the space was lost ("a" where EOS gave "a \\ufffd"); the stop now ends the text as EOS does."""
    spec = Case(deepseek_tokenizer, [], deepseek_tokenizer.token_to_id(EOS_TEXTS[1]), [])
    ids = deepseek_tokenizer.encode("a 😀", add_special_tokens=False).ids[:2]
    stop = deepseek_tokenizer.token_to_id("<think>")
    word = deepseek_tokenizer.encode(" word", add_special_tokens=False).ids
    fed, stops, reason = {
        "stop_token": (ids + [stop], StopOptions(token_ids=(stop,)), FinishReason.LENGTH),
        "stop_sequence": (ids + word + [stop], StopOptions(token_sequences=(tuple(word + [stop]),)),
                          FinishReason.LENGTH),
        "eos": (ids + [spec.eos], StopOptions(), FinishReason.EOS),
        "length": (ids, StopOptions(), FinishReason.LENGTH),
        "cancelled": (ids, StopOptions(token_ids=(stop,)), FinishReason.CANCELLED),
    }[ending]
    run = Run(spec, fed, stops, reason)
    assert run.text == run.final.result.content == deepseek_tokenizer.decode(ids, skip_special_tokens=False)
    assert run.text == "a \ufffd"
    assert [entry.token_id for entry in run.final.logprobs] == ids


@pytest.mark.parametrize("decoder", [LLAMA2, METASPACE], ids=["llama-2", "metaspace"])
def test_a_stop_token_after_a_run_of_byte_tokens_keeps_its_characters(decoder):
    """``é`` in byte tokens, then a stop token: the run's text is held until a token ends the run,
    and the stop token must not take it with its own text."""
    spec = _sentencepiece(decoder)
    tokenizer = spec.tokenizer
    ids = tokenizer.encode("a", add_special_tokens=False).ids + [tokenizer.token_to_id(f"<0x{b:02X}>")
                                                                 for b in "é".encode()]
    stop = tokenizer.token_to_id("<s>")
    run = Run(spec, ids + [stop], StopOptions(token_ids=(stop,)), FinishReason.LENGTH)
    assert run.text == tokenizer.decode(ids, skip_special_tokens=False) == "aé"
    assert run.final.reason == FinishReason.STOP


# --- byte-fallback runs stream as the whole decode reads them ----------------------------------------


def _byte_fallback(decoder):
    tokenizer = _sentencepiece(decoder).tokenizer
    tokenizer.add_tokens([AddedToken(LITERAL, special=False, normalized=False)])
    byte = {value: tokenizer.token_to_id(f"<0x{value:02X}>") for value in range(256)}
    return tokenizer, byte


def _every_split(tokenizer, ids: list[int]) -> None:
    """Fed one by one and in two groups split anywhere, the deltas join to the whole decode."""
    whole = tokenizer.decode(ids, skip_special_tokens=False)
    for split in range(len(ids) + 1):
        detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
        text = detokenizer.feed_many(ids[:split]) + detokenizer.feed_many(ids[split:]) + detokenizer.finish()
        assert text == whole, split
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join(detokenizer.feed(i) for i in ids) + detokenizer.finish() == whole


@pytest.mark.parametrize("decoder", [LLAMA2, METASPACE], ids=["llama-2", "metaspace"])
def test_a_character_then_a_stray_byte_reads_as_the_whole_group(decoder):
    """Byte fallback reads ``é`` then a stray 0x80 as three U+FFFD; streamed, ``é`` was shown when its
    second byte came and the stray byte added one U+FFFD (``é\\ufffd``)."""
    tokenizer, byte = _byte_fallback(decoder)
    word = tokenizer.token_to_id("▁world,")
    ids = tokenizer.encode("a", add_special_tokens=False).ids + [byte[0xC3], byte[0xA9], byte[0x80], word]
    assert tokenizer.decode(ids, skip_special_tokens=False).startswith("a" + REPLACEMENT_CHAR * 3)
    _every_split(tokenizer, ids)
    _every_split(tokenizer, ids[:-1])  # the run left open at the end
    _every_split(tokenizer, [byte[0x0A], byte[0x80], word])  # a newline in bytes, then a stray byte


@pytest.mark.parametrize("decoder", [LLAMA2, METASPACE], ids=["llama-2", "metaspace"])
def test_a_literal_replacement_character_inside_a_long_stray_run_settles_nothing_wrong(decoder):
    """U+FFFD spelled in bytes (EF BF BD) reads U+FFFD while valid, so the old test that a run's open
    group is invalid (the live window ends in U+FFFD without its last ids) held where it was not: the
    settled text was taken from a live window that then read ``é`` where the whole run reads U+FFFD."""
    tokenizer, byte = _byte_fallback(decoder)
    word, literal = tokenizer.token_to_id("▁world,"), tokenizer.token_to_id(LITERAL)
    fffd = [byte[b] for b in LITERAL.encode()]
    for run in range(14, 26):
        for tail in ([byte[0xC3], byte[0xA9]], [byte[0xC3], byte[0xA9], byte[0xE4], byte[0xB8], byte[0x96]]):
            _every_split(tokenizer, [byte[0xA5]] * run + fffd * 3 + tail + [word])
            _every_split(tokenizer, [byte[0xC3]] + fffd * run + tail + [word])
            _every_split(tokenizer, [byte[0xE4], byte[0xB8]] + [literal] * run + [byte[0x96]] + tail)


# --- log-probability offsets read bytes as the decode does -------------------------------------------


def test_a_surrogate_lead_reads_as_a_stray_byte_in_the_offsets():
    """``ED A1`` starts no character (it would spell a surrogate): the decode reads each byte as its
    own U+FFFD at once, where Python's incremental decoder held both as an open character, so the
    third token's ``text_offset`` was 1 instead of 2."""
    from tokenizers import Tokenizer

    from .test_detokenize_fuzz import EMBEDDED, _byte_level

    spec = _byte_level(Tokenizer.from_file(str(EMBEDDED)))
    ids = [178, 103, 103]  # the embedded tokenizer's lone bytes ED, A1, A1
    assert [spec.raw(i) for i in ids] == [b"\xed", b"\xa1", b"\xa1"]
    run = Run(spec, ids + [spec.eos], StopOptions(), FinishReason.EOS)
    assert run.text == spec.tokenizer.decode(ids) == REPLACEMENT_CHAR * 3
    assert text_logprobs(list(run.final.logprobs))["text_offset"] == [0, 1, 2]

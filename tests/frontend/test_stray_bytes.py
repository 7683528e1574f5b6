"""Runs of stray bytes (bytes that start no UTF-8 character, or start one cut short) in the
detokenizer and in the echoed prompt's offsets (`echoed_token_texts`).

Such a run keeps the decoded text ending in U+FFFD, so its ids stay pending; the detokenizer used to
decode the whole growing window on every id (quadratic: 4,000 stray bytes took seconds, a 32k-token
prompt with ``echo`` and ``logprobs`` minutes). Now the text of all but the last few pending ids is
settled once no later id can change it, so each id is decoded a bounded number of times. Checks:

- a differential one: on random mixes of long stray-byte runs, characters split over tokens and
  the fuzz's text pieces, for the fuzz's six tokenizers (byte-level BPE and SentencePiece byte
  fallback), the deltas, pending text and echo parts equal those of the straightforward reference
  below (the whole pending window decoded on every id, as before), including where a byte-fallback
  decoder reads an invalid group differently from its parts;
- a work bound: the ids decoded for 4,000 and 8,000 stray bytes grow linearly (counted, not timed),
  and the output path's held tokens (`PendingText`) are not rescanned on every release.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer
from helios.frontend.decoding.logprobs import _token_ends, echoed_token_texts
from helios.frontend.responses.output import PendingText

from .test_detokenize_fuzz import FUZZ, LLAMA2, METASPACE, Case, _groups, _sentencepiece, case  # noqa: F401 (fixture)
from .test_logprob_offsets_spm import sentencepiece_like

EMBEDDED = Path(__file__).resolve().parents[2] / "src/helios/embedded/default_model/tokenizer.json"
STRAY = 104  # the embedded tokenizer's lone byte 0xA5
DECODES_PER_ID = 40  # a bound on the ids decoded per id fed: constant, whatever the run's length


class Reference:
    """The straightforward detokenizer: the whole pending window decoded on every id (a byte-fallback
    tokenizer's run of byte tokens pending until a token that is not one ends it)."""

    def __init__(self, tokenizer, skip_special_tokens: bool, holds_byte_runs: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        low = tokenizer.token_to_id("<0x80>")
        is_fallback = holds_byte_runs and low is not None and tokenizer.decode([low]) == REPLACEMENT_CHAR
        self.byte_ids = {tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256)} if is_fallback else set()
        self.in_run = False  # the last id, skipped special tokens aside, is a byte token
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.open_text = ""

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip) if start < end else ""

    def _is_skipped(self, token_id: int) -> bool:
        return (self.skip and not self.tokenizer.decode([token_id], skip_special_tokens=True)
                and bool(self.tokenizer.decode([token_id], skip_special_tokens=False)))

    def feed(self, token_id: int) -> str:
        self.ids.append(token_id)
        if not self._is_skipped(token_id):
            self.in_run = token_id in self.byte_ids
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset, len(self.ids))
        if new_text.endswith(REPLACEMENT_CHAR) or self.in_run:
            self.open_text = new_text[len(prefix_text):]
            return ""
        if len(new_text) <= len(prefix_text):
            if self._is_skipped(token_id):
                self.ids.pop()
            return ""
        self.prefix_offset, self.read_offset, self.open_text = self.read_offset, len(self.ids), ""
        return new_text[len(prefix_text):]

    def finish(self) -> str:
        if self.read_offset == len(self.ids):
            return ""
        return self._decode(self.prefix_offset, len(self.ids))[len(self._decode(self.prefix_offset, self.read_offset)):]


def _reference_ends(tokenizer, ids: list[int], skip: bool, decoded: str) -> list[int]:
    """`_token_ends` as it was: each id's open text compared whole with the decode."""
    reference, ends, num_chars, last = Reference(tokenizer, skip, holds_byte_runs=False), [], 0, 0
    for token_id in ids:
        num_chars += len(reference.feed(token_id))
        pending = reference.open_text
        shown = decoded[num_chars:num_chars + len(pending)]
        agreed = next((i for i, (a, b) in enumerate(zip(pending, shown)) if a != b), min(len(pending), len(shown)))
        last = min(max(last, num_chars + agreed + (agreed < len(pending))), len(decoded))
        ends.append(last)
    if ends:
        ends[-1] = len(decoded)
    return ends


def _split_char_ids(case: Case) -> list[list[int]]:
    """Ids of characters of several bytes spelled byte by byte (byte fallback) or as BPE splits them."""
    chars = ["é", "世", "😀", "€"]
    if case.is_byte_level:
        return [case.tokenizer.encode(char, add_special_tokens=False).ids for char in chars]
    return [[case.tokenizer.token_to_id(f"<0x{byte:02X}>") for byte in char.encode("utf-8")] for char in chars]


def _mixed_ids(case: Case, data) -> list[int]:
    """Long stray runs (lone bytes, cut characters, split characters) between the fuzz's id mixes."""
    ids: list[int] = []
    for kind in data.draw(st.lists(st.sampled_from(["stray", "stray", "split", "mix"]), min_size=1, max_size=6)):
        if kind == "stray":
            ids += data.draw(st.lists(st.sampled_from(case.partial_ids), min_size=1, max_size=50))
        elif kind == "split":
            ids += data.draw(st.sampled_from(_split_char_ids(case)))
        else:
            ids += case.ids(data, 8)
    return ids


@pytest.mark.parametrize("skip", [True, False])
@FUZZ
@given(data=st.data())
def test_deltas_and_pending_text_equal_the_whole_window_reference(case, skip, data):  # noqa: F811
    ids = _mixed_ids(case, data)
    detokenizer = IncrementalDetokenizer(case.tokenizer, skip_special_tokens=skip)
    reference = Reference(case.tokenizer, skip)
    for group in _groups(data, ids):
        assert detokenizer.feed_many(group) == "".join(reference.feed(token_id) for token_id in group)
        assert detokenizer.open_text == reference.open_text
        assert detokenizer.num_pending_tokens == len(reference.ids) - reference.read_offset
    assert detokenizer.finish() == reference.finish()


@pytest.mark.parametrize("skip", [True, False])
@FUZZ
@given(data=st.data())
def test_echo_parts_equal_the_whole_window_reference(case, skip, data):  # noqa: F811
    ids = _mixed_ids(case, data)
    decoded = case.tokenizer.decode(ids, skip_special_tokens=skip)
    assert _token_ends(case.tokenizer, ids, skip, decoded) == _reference_ends(case.tokenizer, ids, skip, decoded)


def test_an_invalid_byte_fallback_group_keeps_its_reading():
    """Byte fallback reads a group of bytes that is not valid UTF-8 as one U+FFFD per byte, a valid
    character at its end included; a long run does not change that (nor its echo parts)."""
    tokenizer = _sentencepiece(LLAMA2).tokenizer
    byte = {value: tokenizer.token_to_id(f"<0x{value:02X}>") for value in range(256)}
    ids = [byte[0xA5]] * 40 + [byte[b] for b in "é".encode()] + [tokenizer.token_to_id("▁world,")]
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.feed(token_id) for token_id in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == REPLACEMENT_CHAR * 42 + " world," == tokenizer.decode(ids)
    decoded = tokenizer.decode(ids)
    assert _token_ends(tokenizer, ids, True, decoded) == _reference_ends(tokenizer, ids, True, decoded)


@pytest.mark.parametrize("decoder", [LLAMA2, METASPACE], ids=["llama-2", "metaspace"])
def test_valid_characters_cut_short_after_a_stray_run_read_as_the_whole_group(decoder):
    """After stray bytes, bytes spelling whole characters and then one cut short read U+FFFD each (the
    group is invalid); the last ids alone would read as valid characters once the cut one completes,
    so their text is not taken from them, whichever id the run ends at."""
    tokenizer = sentencepiece_like(decoder)
    byte = {value: tokenizer.token_to_id(f"<0x{value:02X}>") for value in range(256)}
    for run in range(12, 30):
        ids = [byte[0xA5]] * run + [byte[b] for b in "ééé世".encode()] + [tokenizer.token_to_id("▁world,")]
        detokenizer, reference = IncrementalDetokenizer(tokenizer), Reference(tokenizer, True)
        assert [detokenizer.feed(i) for i in ids] == [reference.feed(i) for i in ids]
        assert detokenizer.finish() == reference.finish()
        decoded = tokenizer.decode(ids)
        assert _token_ends(tokenizer, ids, True, decoded) == _reference_ends(tokenizer, ids, True, decoded)


class CountingDecoder:
    """A tokenizer that counts the ids it is asked to decode."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.decoded_ids = tokenizer, 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.decoded_ids += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)


@pytest.fixture(scope="module")
def embedded() -> Tokenizer:
    return Tokenizer.from_file(str(EMBEDDED))


@pytest.mark.parametrize("count", [4000, 8000])
def test_a_stray_run_decodes_each_id_a_bounded_number_of_times(embedded, count):
    """Stray bytes, a word, stray bytes again (the emitted run is the next window's prefix), then a
    flush: the text is the whole decode and the ids decoded stay within a constant per id."""
    assert embedded.decode([STRAY]) == REPLACEMENT_CHAR
    word = embedded.encode(" word", add_special_tokens=False).ids
    ids = [STRAY] * count + word + [STRAY] * count
    counting = CountingDecoder(embedded)
    detokenizer = IncrementalDetokenizer(counting)
    text = detokenizer.feed_many(ids) + detokenizer.finish()
    assert text == embedded.decode(ids) == REPLACEMENT_CHAR * count + " word" + REPLACEMENT_CHAR * count
    assert counting.decoded_ids <= DECODES_PER_ID * len(ids)


@pytest.mark.parametrize("count", [4000, 8000])
def test_echo_parts_of_a_stray_run_decode_each_id_a_bounded_number_of_times(embedded, count):
    """An id prompt of stray bytes echoed with logprobs: one U+FFFD per token, linear decode work."""
    ids = [STRAY] * count
    text = embedded.decode(ids, skip_special_tokens=False)
    counting = CountingDecoder(embedded)
    assert echoed_token_texts(counting, ids, text) == (REPLACEMENT_CHAR,) * count
    assert counting.decoded_ids <= DECODES_PER_ID * len(ids)


class CountingSegments(deque):
    """A deque that counts the items read by iterating it."""

    read = 0

    def __iter__(self):
        for item in super().__iter__():
            CountingSegments.read += 1
            yield item


def test_held_tokens_without_text_are_not_rescanned_on_each_release():
    """The output path holds each stray byte's token (no text yet) for a stop matcher; finding the
    first token with text must not rescan them all on every release (quadratic in the run)."""
    pending = PendingText()
    pending._segments = CountingSegments()
    CountingSegments.read = 0
    count = 4000
    for token_id in range(count):
        pending.push(token_id, "")
        assert pending.release(0) == ([], [])
    pending.push(count, REPLACEMENT_CHAR * count + "!")
    released, _ = pending.release(count + 1)
    assert [token_id for token_id, _ in released] == list(range(count + 1))
    pending.push(count + 1, "")
    pending.push(count + 2, "a")
    assert not pending.release(0)[0] and pending.has_text
    assert [token_id for token_id, _ in pending.release(1)[0]] == [count + 1, count + 2] and not pending
    assert CountingSegments.read <= 4 * count


@pytest.mark.parametrize("count", [2000, 4000])
def test_an_invalid_byte_fallback_run_growing_by_valid_bytes_decodes_each_id_a_bounded_number_of_times(count):
    """A byte-fallback run made invalid by its first byte, then bytes spelling a literal U+FFFD, then
    `count` bytes spelling valid characters: the run's text shows once a token ends it, so it is not
    decoded on each id (it was, whole: 8 million ids decoded for 4,000 bytes, as the U+FFFD bytes
    kept the settling test from telling the run was invalid for good)."""
    tokenizer = _sentencepiece(LLAMA2).tokenizer
    byte = {value: tokenizer.token_to_id(f"<0x{value:02X}>") for value in range(256)}
    run = b"\xa5" + "\ufffd".encode() * 3 + "é".encode() * (count // 2)
    ids = [byte[value] for value in run] + [tokenizer.token_to_id("▁world,")]
    counting = CountingDecoder(tokenizer)
    detokenizer = IncrementalDetokenizer(counting)
    deltas = [detokenizer.feed(token_id) for token_id in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] + detokenizer.finish() == tokenizer.decode(ids) == REPLACEMENT_CHAR * len(run) + " world,"
    assert counting.decoded_ids <= DECODES_PER_ID * len(ids)

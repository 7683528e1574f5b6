"""Differential fuzz of the output text path against the tokenizers' own ``decode``.

Random id sequences (ids of text pieces, ids holding part of a UTF-8 character, byte-fallback
tokens, special and added tokens, ``\\r\\n``, SentencePiece ``▁`` tokens) go through
`IncrementalDetokenizer` one id at a time and in random groups, and through the frontend's output
path (`OutputProcessor` with string stops, token stops, EOS and log-probabilities) as a request
builds it, on six tokenizers: the embedded default model's, Qwen's and DeepSeek's (byte-level BPE),
SentencePiece-style ones (``▁`` word markers, byte-fallback tokens; Llama-2's decoder and the
Metaspace decoder) and one with added special and non-special tokens. References:

- detokenization: the deltas joined equal ``tokenizer.decode(ids, skip_special_tokens=...)``; only
  the flushed tail may end in U+FFFD (an open character);
- string stops: the decode cut at the stop that completes first (of those, the longest; stop
  excluded), finish reason ``stop``, the text streamed equal to it; token stops: the decode of the
  ids before the matched sequence (a character they leave open shows as U+FFFD, as at EOS);
- log-probabilities: one entry per token whose text starts before the cut (a token continuing a
  character where that character starts), ``text_offset`` the length of the text the tokens before
  it decode to (an open character counted once).

Where a tokenizer's decode of the whole is not the decode of its start followed by more text
(byte-fallback groups: a complete character followed by a stray byte decodes to U+FFFD for every
byte of the group), no stream can match it and the sequence is not checked against it.
"""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders

from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer, lossy_utf8
from helios.frontend.decoding.logprobs import TokenTexts, text_logprobs
from helios.frontend.decoding.observation import ObservationOptions
from helios.frontend.decoding.stops import StopOptions
from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
from helios.frontend.responses.output import OutputProcessor
from helios.runtime.records.events import FinishReason, TokenLogprobs
from support.sweeps import swept

from .conftest import _byte_to_unicode
from .test_logprob_offsets_spm import sentencepiece_like

EMBEDDED = Path(__file__).resolve().parents[2] / "src/helios/embedded/default_model/tokenizer.json"
# Examples per fuzz test and tokenizer (here and in test_stray_bytes): 30 by default take every
# tokenizer's decode path; HELIOS_DETOKENIZE_FUZZ_SWEEP=1 draws 60.
FUZZ = settings(max_examples=60 if swept("HELIOS_DETOKENIZE_FUZZ_SWEEP") else 30, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
LLAMA2 = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                            decoders.Strip(" ", 1, 0)])
METASPACE = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")])
PIECES = ["Hello", " world", ", the", " quick", "\r\n", "\n\n", "  ", " ", "é", "世界", "😀", "👍🏽", "€uro", "x",
          "<think>", "end", "\t{\"a\": 1}", "ꙮ", "𓀀"]
ADDED = [("<|sep|>", True), ("[TOOL]", False), ("<think>", False), (" spaced ", False)]
BYTES_OF = {char: byte for byte, char in _byte_to_unicode().items()}  # byte-level BPE's alphabet
EOS_TEXTS = ("<|im_end|>", "<｜end▁of▁sentence｜>")


class Case:
    """A tokenizer and the pools of ids a fuzz draws from."""

    def __init__(self, tokenizer: Tokenizer, partial_ids: list[int], eos: int, space_ids: list[int],
                 is_byte_level: bool = True):
        self.tokenizer = tokenizer
        self.is_byte_level = is_byte_level
        self.partial_ids = partial_ids  # ids holding part of a UTF-8 character
        self.space_ids = space_ids  # ids of white space alone
        self.special_ids = sorted(tokenizer.get_added_tokens_decoder())
        self.piece_ids = [tokenizer.encode(piece, add_special_tokens=False).ids for piece in PIECES]
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos = eos
        self.token_texts = TokenTexts(tokenizer, self.raw)  # raw bytes as the grammar's vocabulary spells them

    def raw(self, token_id: int) -> bytes:
        """A token's own bytes: a byte-level token's, a byte-fallback token's byte, a ``▁`` word's text
        with its space, an added token's text."""
        added = self.tokenizer.get_added_tokens_decoder().get(token_id)
        token = self.tokenizer.id_to_token(token_id)
        if added is not None:
            return added.content.encode("utf-8")
        if self.is_byte_level:
            return bytes(BYTES_OF[char] for char in token)
        if token.startswith("<0x") and len(token) == 6:
            return bytes([int(token[3:5], 16)])
        return token.replace("▁", " ").encode("utf-8")

    def ids(self, data, max_size: int = 24) -> list[int]:
        """A random id sequence (without EOS)."""
        pools = [st.sampled_from(self.piece_ids),
                 st.sampled_from(self.partial_ids).map(lambda i: [i]),
                 st.sampled_from(self.special_ids).map(lambda i: [i]),
                 st.sampled_from(self.space_ids).map(lambda i: [i]),
                 st.integers(0, self.vocab_size - 1).map(lambda i: [i])]
        groups = data.draw(st.lists(st.one_of(*pools), max_size=max_size // 2))
        return [i for group in groups for i in group if i != self.eos and self.tokenizer.id_to_token(i) is not None]


def _byte_level_partial_ids(tokenizer: Tokenizer) -> list[int]:
    partial = []
    for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        raw = bytes(BYTES_OF[char] for char in token if char in BYTES_OF)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            partial.append(token_id)
    return sorted(partial)[:400]


def _byte_level(tokenizer: Tokenizer) -> Case:
    eos = next(tokenizer.token_to_id(text) for text in EOS_TEXTS if tokenizer.token_to_id(text) is not None)
    return Case(tokenizer, _byte_level_partial_ids(tokenizer), eos,
                _space_ids(tokenizer))


def _space_ids(tokenizer: Tokenizer) -> list[int]:
    return sorted({i for text in (" ", "  ", "\r\n", "\n") for i in tokenizer.encode(text, add_special_tokens=False).ids})


def _sentencepiece(decoder) -> Case:
    tokenizer = sentencepiece_like(decoder)
    partial = [tokenizer.token_to_id(f"<0x{byte:02X}>") for byte in range(0x80, 0x100)]
    return Case(tokenizer, partial, tokenizer.token_to_id("</s>"), [tokenizer.token_to_id("▁")] + _space_ids(tokenizer),
                False)


def _with_added_tokens() -> Case:
    tokenizer = Tokenizer.from_file(str(EMBEDDED))
    tokenizer.add_tokens([AddedToken(text, special=special, normalized=False) for text, special in ADDED])
    return _byte_level(tokenizer)


_PACKAGE_CASES: dict[str, Case] = {}  # the session tokenizers' cases: read-only, shared by the modules using `case`


@pytest.fixture(scope="module", params=["embedded", "qwen", "deepseek", "sentencepiece", "metaspace", "added"])
def case(request) -> Case:
    if request.param == "embedded":
        return _byte_level(Tokenizer.from_file(str(EMBEDDED)))
    if request.param in ("qwen", "deepseek"):  # once per process (a second or so for their vocabularies' scan)
        if request.param not in _PACKAGE_CASES:
            _PACKAGE_CASES[request.param] = _byte_level(request.getfixturevalue(f"{request.param}_tokenizer"))
        return _PACKAGE_CASES[request.param]
    if request.param == "sentencepiece":
        return _sentencepiece(LLAMA2)
    if request.param == "metaspace":
        return _sentencepiece(METASPACE)
    return _with_added_tokens()


def _groups(data, ids: list[int]) -> list[list[int]]:
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=len(ids), max_size=len(ids)))
    out, start = [], 0
    for size in sizes:
        if start >= len(ids):
            break
        out.append(ids[start:start + size])
        start += size
    return out


def _is_prefix_stable(tokenizer: Tokenizer, ids: list[int], skip: bool) -> bool:
    """Whether the complete text of every start of `ids` begins the decode of all of them."""
    whole = tokenizer.decode(ids, skip_special_tokens=skip)
    return all(whole.startswith(tokenizer.decode(ids[:k], skip_special_tokens=skip).rstrip(REPLACEMENT_CHAR))
               for k in range(len(ids)))


def _shown(tokenizer: Tokenizer, ids: list[int]) -> str:
    """The text `ids` show before the end: the decode of the longest start of them that leaves no
    character open (a token's text is shown whole, with the character it completes) and, on a
    byte-fallback tokenizer, does not end in a byte token (a later byte can change its run's text)."""
    for count in range(len(ids), -1, -1):
        text = tokenizer.decode(ids[:count], skip_special_tokens=False)
        if not text.endswith(REPLACEMENT_CHAR) and not (count and _is_fallback_byte(tokenizer, ids[count - 1])):
            return text
    return ""


def _known(case: Case, ids: list[int]) -> str:
    """The text of `ids` that no later id changes, which stops are matched on: on a byte-level
    tokenizer their decode less a last U+FFFD where their bytes leave a character open; on a
    byte-fallback one the decode of the ids before the run of byte tokens at their end (a later
    byte can change the whole run's text)."""
    tokenizer = case.tokenizer
    if not case.is_byte_level:
        count = len(ids)
        while count and _is_fallback_byte(tokenizer, ids[count - 1]):
            count -= 1
        return tokenizer.decode(ids[:count], skip_special_tokens=False)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if text.endswith(REPLACEMENT_CHAR) and lossy_utf8(b"".join(case.raw(token_id) for token_id in ids))[1]:
        return text[:-1]
    return text


def _is_fallback_byte(tokenizer: Tokenizer, token_id: int) -> bool:
    """Whether `token_id` is a ``<0xNN>`` token that `tokenizer` decodes as a byte (byte fallback)."""
    low = tokenizer.token_to_id("<0x80>")
    token = tokenizer.id_to_token(token_id) or ""
    return low is not None and tokenizer.decode([low]) == REPLACEMENT_CHAR and len(token) == 6 and token.startswith("<0x")


# --- detokenization ----------------------------------------------------------------------------


@pytest.mark.parametrize("skip", [True, False])
@FUZZ
@given(data=st.data())
def test_streamed_deltas_join_to_the_whole_decode(case, skip, data):
    ids = case.ids(data)
    if not _is_prefix_stable(case.tokenizer, ids, skip):
        return
    detokenizer = IncrementalDetokenizer(case.tokenizer, skip_special_tokens=skip)
    deltas = [detokenizer.feed_many(group) for group in _groups(data, ids)]
    tail = detokenizer.finish()
    assert "".join(deltas) + tail == case.tokenizer.decode(ids, skip_special_tokens=skip)
    assert not any(delta.endswith(REPLACEMENT_CHAR) for delta in deltas)


@pytest.mark.parametrize("skip", [True, False])
@FUZZ
@given(data=st.data())
def test_a_continuation_adds_what_the_context_and_output_decode_to(case, skip, data):
    context, ids = case.ids(data, 8), case.ids(data)
    tokenizer = case.tokenizer
    # The detokenizer reads the context's last ids unless they hold no text or end inside a character;
    # an output starting with a byte-fallback byte leaves out the run of byte tokens the context ends in
    # (all of it where what is left holds no text).
    usable = context[-5:]
    if not tokenizer.decode(usable) or tokenizer.decode(usable, skip_special_tokens=skip).endswith(REPLACEMENT_CHAR):
        usable = []
    def skipped(token_id: int) -> bool:
        text, kept = (tokenizer.decode([token_id], skip_special_tokens=flag) for flag in (skip, False))
        return not text and bool(kept)

    first = next((i for i in ids if not skipped(i)), None)
    if first is not None and _is_fallback_byte(tokenizer, first):
        cut = len(usable)  # before the run of bytes (skipped specials among them) the context ends in
        while cut and (_is_fallback_byte(tokenizer, usable[cut - 1]) or skipped(usable[cut - 1])):
            cut -= 1
        if any(_is_fallback_byte(tokenizer, i) for i in usable[cut:]):
            usable = usable[:cut] if tokenizer.decode(usable[:cut]) else []
    context_text = tokenizer.decode(usable, skip_special_tokens=skip)
    if not _is_prefix_stable(tokenizer, usable + ids, skip):
        return
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip, context_ids=context)
    deltas = [detokenizer.feed_many(group) for group in _groups(data, ids)]
    assert context_text + "".join(deltas) + detokenizer.finish() == tokenizer.decode(usable + ids,
                                                                                    skip_special_tokens=skip)
    assert not any(delta.endswith(REPLACEMENT_CHAR) for delta in deltas)


@pytest.mark.parametrize("decoder", [LLAMA2, METASPACE], ids=["llama-2", "metaspace"])
def test_a_leading_space_token_keeps_its_space(decoder):
    """A SentencePiece ``▁`` alone at the start decodes to nothing (the decoder strips the text's
    first space), but it is text: the word after it keeps its space, as in the whole decode."""
    tokenizer = sentencepiece_like(decoder)
    ids = [tokenizer.token_to_id("▁"), tokenizer.token_to_id("▁world,")]
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert detokenizer.feed_many(ids) + detokenizer.finish() == tokenizer.decode(ids) == " world,"


# --- the output path: stops, EOS and log-probabilities ----------------------------------------


class Run:
    """One request's output path fed `ids`: the text each step shows, the final record and the
    number of steps fed before one reported a stop (None: none did)."""

    def __init__(self, case: Case, ids: list[int], stops: StopOptions, finish: FinishReason):
        output = OutputProcessor(IncrementalDetokenizer(case.tokenizer, skip_special_tokens=False),
                                 OutputPipeline(PlainText()), stops.new_matcher(), [case.eos], ObservationOptions(),
                                 [1], None, case.token_texts)
        self.step_texts, self.step_entries, self.stopped_at = [], [], None
        for index, token_id in enumerate(ids):
            step = output.feed(token_id, None, TokenLogprobs(-1.0, ((token_id, -1.0),)))
            self.step_texts.append("".join(event.text for event in step.events))
            self.step_entries += step.logprobs
            if step.is_stopped and self.stopped_at is None:
                self.stopped_at = index + 1
        self.final = output.finish(finish)
        self.text = "".join(self.step_texts) + "".join(event.text for event in self.final.events)


def _reference_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where `text` is cut: the start of the stop that completes first (of those, the longest)."""
    best = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0:
            best = min(best or (len(text) + 1, 0), (start + len(stop), -len(stop)))
    return None if best is None else best[0] + best[1]


def _stop_strings(data, case: Case, text: str) -> tuple[str, ...]:
    """1-4 stops: pieces of `text` (across token boundaries), prefixes of one another, characters
    of several bytes, pieces of special tokens' text and a stop longer than the output."""
    def piece(length_cap: int) -> str:
        if not text:
            return "é"
        start = data.draw(st.integers(0, len(text) - 1))
        return text[start:start + data.draw(st.integers(1, length_cap))]

    specials = [token.content for token in case.tokenizer.get_added_tokens_decoder().values()]
    kinds = st.sampled_from(["piece", "prefix", "multibyte", "special", "long"])
    stops: list[str] = []
    for kind in data.draw(st.lists(kinds, min_size=1, max_size=4)):
        if kind == "piece":
            stops.append(piece(8))
        elif kind == "prefix":
            whole = piece(8)
            stops += [whole, whole[:data.draw(st.integers(1, len(whole)))]]
        elif kind == "multibyte":
            stops.append(data.draw(st.sampled_from(["é", "世", "😀", "界\n", "🏽", "\r\n"])))
        elif kind == "special":
            special = data.draw(st.sampled_from(specials))
            start = data.draw(st.integers(0, len(special) - 1))
            stops.append(special[start:start + data.draw(st.integers(1, 6))])
        else:
            stops.append(text + "!" + text)
    return tuple(stops[:4])


def _check_offsets(case: Case, ids: list[int], offsets: list[int], text: str) -> None:
    """`offsets` (of `ids`' entries) index `text`: in order, within it, and a token after which
    no character is open starts where the text of the tokens before it ends; on byte-level
    tokenizers, whose decode spells an open character as one U+FFFD, every token starts there."""
    assert len(offsets) == len(ids)
    assert offsets == sorted(offsets) and all(0 <= offset <= len(text) for offset in offsets)
    for count, offset in enumerate(offsets):
        before = case.tokenizer.decode(ids[:count], skip_special_tokens=False)
        if case.is_byte_level or not before.endswith(REPLACEMENT_CHAR):
            assert offset == len(before)
        else:  # a character left open counts once
            assert len(before.rstrip(REPLACEMENT_CHAR)) < offset <= len(before)


def _check_listed(case: Case, ids: list[int], cut: int, num_listed: int) -> None:
    """Listed: the ids whose text starts before `cut`. On byte-level tokenizers, exactly those whose
    first byte is in a character before it (the UTF-8 decoding of the bytes before them completes
    fewer characters); elsewhere at least those whose text ends before `cut` and none whose text
    starts after it."""
    if case.is_byte_level:
        raw = [case.raw(token_id) for token_id in ids]
        assert num_listed == sum(_complete_chars(b"".join(raw[:count])) < cut for count in range(len(ids)))
        return
    decoded = [case.tokenizer.decode(ids[:count], skip_special_tokens=False) for count in range(1, len(ids) + 1)]
    within = next((count for count in range(len(ids), 0, -1)
                   if not decoded[count - 1].endswith(REPLACEMENT_CHAR) and len(decoded[count - 1]) < cut), 0)
    assert within <= num_listed <= sum(len(_shown(case.tokenizer, ids[:count])) < cut for count in range(len(ids)))


def _complete_chars(raw: bytes) -> int:
    """Characters of `raw`'s lossy UTF-8 decoding, an incomplete character at its end left out."""
    return len(codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw, final=False))


@FUZZ
@given(data=st.data())
def test_string_stops_cut_the_decode_at_the_first_completed_stop(case, data):
    tokenizer = case.tokenizer
    ids = case.ids(data)
    if not _is_prefix_stable(tokenizer, ids, False):
        return
    whole = tokenizer.decode(ids, skip_special_tokens=False)
    stops = _stop_strings(data, case, whole)
    ends_with_eos = data.draw(st.booleans())
    run = Run(case, ids + ([case.eos, ids[0] if ids else case.eos] if ends_with_eos else []),
              StopOptions(strings=stops), FinishReason.EOS if ends_with_eos else FinishReason.LENGTH)
    cut = _reference_stop(whole, stops)
    assert run.text == whole[:cut]
    # Log-probabilities: the entries of the returned text, placed where their text starts in it.
    entries = list(run.final.logprobs)
    assert entries[:len(run.step_entries)] == run.step_entries
    assert [entry.token_id for entry in entries] == ids[:len(entries)]
    _check_offsets(case, ids[:len(entries)], text_logprobs(entries)["text_offset"], run.text)
    if cut is None:
        assert run.final.reason == (FinishReason.EOS if ends_with_eos else FinishReason.LENGTH)
        assert run.stopped_at is None
        assert len(entries) == len(ids)
        return
    assert run.final.reason == FinishReason.STOP
    # The stop is reported by the token that completes its text where no later id changes that text,
    # also while the detokenizer holds it behind an open character (or at the end, in the flushed tail).
    completes = next((count for count in range(1, len(ids) + 1)
                      if _reference_stop(_known(case, ids[:count]), stops) is not None), None)
    assert run.stopped_at == completes
    assert run.final.usage.completion_tokens == (completes or len(ids) + ends_with_eos)
    _check_listed(case, ids, cut, len(entries))


@FUZZ
@given(data=st.data())
def test_token_stops_show_the_text_before_the_matched_ids(case, data):
    tokenizer = case.tokenizer
    ids = case.ids(data)
    if not ids or not _is_prefix_stable(tokenizer, ids, False):
        return
    start = data.draw(st.integers(0, len(ids) - 1))
    sequence = tuple(ids[start:start + data.draw(st.integers(1, 3))])
    singles = tuple(data.draw(st.lists(st.sampled_from(ids + case.special_ids), max_size=2)))
    run = Run(case, ids + [case.eos], StopOptions(token_ids=singles, token_sequences=(sequence,)), FinishReason.EOS)
    stops = [(i,) for i in singles] + [sequence]
    end = next(count for count in range(1, len(ids) + 1) if any(tuple(ids[:count][-len(s):]) == s for s in stops))
    first = min(end - len(s) for s in stops if tuple(ids[:end][-len(s):]) == s)
    assert run.stopped_at == end
    assert run.final.reason == FinishReason.STOP
    assert run.text == tokenizer.decode(ids[:first], skip_special_tokens=False)
    assert run.final.usage.completion_tokens == end
    entries = list(run.final.logprobs)
    assert [entry.token_id for entry in entries] == ids[:first]  # every id before the stop shows its text
    _check_offsets(case, ids[:first], text_logprobs(entries)["text_offset"], run.text)


def test_a_stop_that_hides_a_split_character_hides_the_entry_of_its_first_byte(deepseek_tokenizer):
    """The emoji's first token shows nothing (its character is open); the stop hides the emoji, so
    neither of its tokens is listed (the first was, at the end of the empty text)."""
    case = Case(deepseek_tokenizer, [], deepseek_tokenizer.token_to_id(EOS_TEXTS[1]), [])
    ids = deepseek_tokenizer.encode("a😀!", add_special_tokens=False).ids
    run = Run(case, ids, StopOptions(strings=("😀",)), FinishReason.LENGTH)
    assert (run.text, run.stopped_at, run.final.reason) == ("a", 3, FinishReason.STOP)
    assert [entry.token_id for entry in run.final.logprobs] == ids[:1]


def test_a_stop_inside_a_held_group_lists_only_the_tokens_whose_text_it_shows(deepseek_tokenizer):
    """`` \\xf0\\x9f\\x98`` holds a space and the emoji's first bytes and shows nothing alone; ``\\x80``
    completes the emoji, and its delta `` 😀`` starts with the first token's space. The stop hides
    the emoji: the space is shown (its token is listed), and the second token's text is all hidden
    (it was listed, with a text_offset past the end of the text)."""
    case = Case(deepseek_tokenizer, [], deepseek_tokenizer.token_to_id(EOS_TEXTS[1]), [])
    ids = deepseek_tokenizer.encode("a 😀x", add_special_tokens=False).ids
    assert [case.raw(token_id) for token_id in ids[1:3]] == [b" \xf0\x9f\x98", b"\x80"]
    run = Run(case, ids, StopOptions(strings=("😀",)), FinishReason.LENGTH)
    assert (run.text, run.stopped_at) == ("a ", 3)
    entries = list(run.final.logprobs)
    assert [entry.token_id for entry in entries] == ids[:2]
    assert text_logprobs(entries)["text_offset"] == [0, 1]


def test_a_token_without_text_at_the_end_is_listed_and_no_stop_is_reported():
    """A lone ``▁`` output shows no text; its entry waits for text that never comes, and the end
    releases it without reporting a stop (held text left at the end means a stop only if it has text)."""
    case = _sentencepiece(LLAMA2)
    space = case.tokenizer.token_to_id("▁")
    run = Run(case, [space], StopOptions(strings=("x",)), FinishReason.LENGTH)
    assert (run.text, run.stopped_at, run.final.reason) == ("", None, FinishReason.LENGTH)
    assert [entry.token_id for entry in run.final.logprobs] == [space]

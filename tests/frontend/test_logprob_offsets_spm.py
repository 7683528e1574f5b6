"""Text completions' ``logprobs.text_offset`` index the returned ``text`` on SentencePiece-style
tokenizers (Llama-2/Mistral: ``▁`` word markers, byte-fallback tokens), whose tokens decoded alone
lose the leading space they show in context (``▁world`` reads ``world`` alone, `` world`` after a
word): each offset drifted by one per such token. Token i's offset is the length of the text its
first i tokens show (a character split over byte tokens counts once, for the token with its first
byte), in the whole body and however a stream's chunks group the tokens.

The tokenizers are built here (a small BPE trained with the Metaspace pre-tokenizer, byte-fallback
tokens added), with Llama-2's decoder sequence and with the Metaspace decoder; the output path is
the frontend's (`OutputProcessor` over `IncrementalDetokenizer`, `TokenTexts` with the grammar's
token bytes), as a text completion request builds it."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from helios.frontend.decoding.detokenize import IncrementalDetokenizer
from helios.frontend.decoding.logprobs import TextOffsets, TokenTexts, text_logprobs
from helios.frontend.decoding.observation import ObservationOptions
from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
from helios.frontend.responses.output import OutputProcessor
from helios.frontend.structured.grammar import GrammarCompiler
from helios.runtime.records.events import FinishReason, TokenLogprobs

from .test_step_run import GROUPINGS

CORPUS = ["Hello world, the quick brown fox jumps over the lazy dog.", "Once upon a time there was a tiny model."] * 20
SPECIALS = ["<unk>", "<s>", "</s>"]
EOS = 2
# Words, a double space, and characters spelled in byte-fallback tokens.
TEXT = "Hello world, €uro 𓀀 the  fox.ꙮ x"
DECODERS = {
    "llama-2": decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                  decoders.Strip(" ", 1, 0)]),
    "metaspace": decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")]),
}


def sentencepiece_like(decoder) -> Tokenizer:
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS, show_progress=False))
    vocab = trained.get_vocab()
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = trained.pre_tokenizer
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.decoder = decoder
    return tokenizer


@pytest.fixture(scope="module", params=list(DECODERS))
def run(request):
    """The tokenizer, TEXT's ids, the output path's final record and the text it returned."""
    tokenizer = sentencepiece_like(DECODERS[request.param])
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    grammar = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[EOS])
    output = OutputProcessor(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), OutputPipeline(PlainText()),
                             None, [EOS], ObservationOptions(), [1], None, TokenTexts(tokenizer, grammar.token_bytes))
    events = []
    for token_id in ids + [EOS]:
        events += output.feed(token_id, None, TokenLogprobs(-1.0, ((token_id, -1.0),))).events
    final = output.finish(FinishReason.EOS, 0)
    text = "".join(getattr(event, "text", "") for event in events + list(final.events))
    pieces = [tokenizer.decode([i]) for i in ids]
    assert sum(piece.startswith(" ") for piece in pieces) < sum(tokenizer.id_to_token(i).startswith("▁") for i in ids[1:])
    assert sum(tokenizer.id_to_token(i).startswith("<0x") for i in ids) >= 6  # split characters
    return tokenizer, ids, final, text


def expected_offsets(tokenizer, ids) -> list[int]:
    """The length of the text each token's predecessors show, an open character counted once."""
    offsets = []
    for i in range(len(ids)):
        shown = tokenizer.decode(ids[:i], skip_special_tokens=False)
        complete = shown.rstrip("\ufffd")
        offsets.append(len(complete) + (complete != shown))
    return offsets


def test_json_offsets_index_the_text_of_word_marker_tokens(run):
    tokenizer, ids, final, text = run
    assert text == tokenizer.decode(ids) == TEXT
    offsets = text_logprobs(final.logprobs)["text_offset"]
    assert offsets == expected_offsets(tokenizer, ids)
    world = ids.index(tokenizer.token_to_id("▁world,"))
    assert text[offsets[world]:offsets[world + 1]] == " world,"  # its text alone is "world,"
    assert text[offsets[-1]:] == tokenizer.decode(ids)[len(tokenizer.decode(ids[:-1])):]


@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_streamed_offsets_index_the_text_however_chunks_group_tokens(run, grouping):
    tokenizer, ids, final, _ = run
    entries, expected = list(final.logprobs), expected_offsets(tokenizer, ids)
    for sizes in ([1] * len(entries), GROUPINGS[grouping](len(entries))):
        offsets, placed, start = TextOffsets(), [], 0
        for size in sizes:
            placed += text_logprobs(entries[start:start + size], offsets)["text_offset"]
            start += size
        assert placed == expected

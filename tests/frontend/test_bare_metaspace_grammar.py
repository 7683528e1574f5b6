"""Constrained output over a tokenizer whose decoder is a bare Metaspace (not inside a Sequence), as
SentencePiece Unigram models such as T5's and ALBERT's ship it: llguidance refused such a tokenizer
at load ("can't determine decoder type"), so the model could serve no structured output at all.

The tokenizer is built here: a small Unigram model trained with the Metaspace pre-tokenizer and
`decoders.Metaspace()` as its top-level decoder. Its ``▁`` words must read as the text shows them
(a leading space), so a grammar's spaces are constrained and a space in a grammar is matched by a
``▁`` word; sampled outputs under the masks go through the request's output path and must match."""

from __future__ import annotations


import numpy as np
import pytest
import regex
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from helios.frontend.session import FrontendModel
from helios.frontend.structured.grammar import GrammarCompiler

from .served import served_contract
from .test_constrained_formats_fuzz import Case, content, forced_ids, sample
from .test_echo_offsets import NONE_FRONTEND

CORPUS = ["the quick brown fox jumps over the lazy dog", "once upon a time there was a tiny model"] * 20
SPECIALS = ["<unk>", "<s>", "</s>"]
EOS = 2
WORDS = "(?:the|quick|brown|fox|lazy|dog|time|tiny|model)"


def bare_metaspace_unigram() -> Tokenizer:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace("\u2581", prepend_scheme="always")
    tokenizer.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=SPECIALS,
                                                                  unk_token="<unk>", show_progress=False))
    return tokenizer


@pytest.fixture(scope="module")
def case() -> Case:
    tokenizer = bare_metaspace_unigram()
    assert tokenizer.to_str().count('"Metaspace"') == 2  # pre-tokenizer and top-level decoder
    assert '"decoder":{"type":"Metaspace"' in tokenizer.to_str().replace(" ", "")
    contract = served_contract(tokenizer.get_vocab_size(), NONE_FRONTEND, [EOS])
    model = FrontendModel.from_contract(contract, tokenizer, "{% for m in messages %}{{ m.content }}{% endfor %}")
    return Case.of(model, EOS, tokenizer.get_vocab_size())


def word_ids(case: Case, text: str) -> list[int]:
    return case.model._tokenizer.encode(text, add_special_tokens=False).ids


def test_a_bare_metaspace_tokenizer_loads_and_its_words_read_with_their_space(case):
    tokenizer = case.model._tokenizer
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[EOS])
    assert compiler.token_bytes(tokenizer.token_to_id("\u2581the")) == b" the"
    ids = word_ids(case, "the fox")
    assert all(tokenizer.id_to_token(i).startswith("\u2581") for i in ids[:1])
    assert case.text(ids) == " the fox"  # as the grammar spells the tokens: every ▁ a space


def test_a_bare_metaspace_grammar_constrains_spaces(case):
    the_fox = word_ids(case, "the fox")
    assert forced_ids(case.prepare({"type": "regex", "regex": " the fox"}), the_fox + [EOS])
    assert not forced_ids(case.prepare({"type": "regex", "regex": "\\S+"}), the_fox[:1])  # ▁the is " the"
    assert not forced_ids(case.prepare({"type": "regex", "regex": " thefox"}), the_fox + [EOS])
    prepared = case.prepare({"type": "choice", "choices": [" the fox"]})
    assert content(prepared, the_fox, True) == " the fox"


def test_sampled_outputs_over_a_bare_metaspace_tokenizer_match_their_regex(case):
    rng = np.random.default_rng(5)
    pattern = f"{WORDS}(?: {WORDS}){{0,3}}"
    prepared = case.prepare({"type": "regex", "regex": pattern})
    ended = 0
    for index in range(12):
        ids, done = sample(prepared.grammar.fork(), case, rng, (0.0, 0.7, 1.5)[index % 3], max_tokens=16)
        seen = case.text(ids)
        if done:
            assert content(prepared, ids, True) == seen and regex.fullmatch(pattern, seen), seen
            ended += 1
        else:
            assert regex.fullmatch(pattern, seen, partial=True), seen
    assert ended >= 6

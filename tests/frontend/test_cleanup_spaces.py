"""Tokenization-space cleanup (`tokenizer_config.json`'s ``clean_up_tokenization_spaces``) against
transformers: `SpaceCleanup` streams transformers' own ``clean_up_tokenization`` however its input is
split, and an `IncrementalDetokenizer` that cleans streams deltas whose concatenation is what
``AutoTokenizer.from_pretrained(...).decode(ids)`` returns for a tokenizer that transformers cleans
(a WordLevel one here, of ``▁`` words: " '" is held until the next token shows whether " ' " follows)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from helios.frontend.decoding.detokenize import IncrementalDetokenizer, SpaceCleanup

SENTENCE = "Hello , world . I do n't know ! It 's fine ? We 've got it , they 're here . I 'm ok ' s"
PIECES = [" ", " ", " ", ".", "?", "!", ",", "'", "n", "t", "s", "m", "v", "e", "r", "x", "n't", " '"]


def reference_cleanup(text: str) -> str:
    return PreTrainedTokenizerBase.clean_up_tokenization(None, text)  # uses no state of the tokenizer


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map("".join), max_size=20))
def test_streamed_cleanup_is_the_whole_text_cleanup(pieces):
    cleanup = SpaceCleanup()
    streamed = "".join(cleanup.push(piece) for piece in pieces) + cleanup.flush()
    assert streamed == reference_cleanup("".join(pieces))


def test_a_replacement_is_not_scanned_again_as_str_replace_does_not():
    # "  ." -> " ." (one replacement, no rescan); " ' " then makes " 's", which a later link replaces.
    for text in ["a  .", "x  ' s", "a ' ' b", "do  n't"]:
        for cut in range(len(text) + 1):
            cleanup = SpaceCleanup()
            assert cleanup.push(text[:cut]) + cleanup.push(text[cut:]) + cleanup.flush() == reference_cleanup(text)


@pytest.fixture(scope="module")
def word_level(tmp_path_factory) -> tuple[Tokenizer, object]:
    """A WordLevel tokenizer with SentencePiece-style ``▁`` words (not BPE, so transformers cleans) and
    transformers' view of it."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator([SENTENCE], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    directory = tmp_path_factory.mktemp("word_level")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"clean_up_tokenization_spaces": True, "eos_token": "</s>", "unk_token": "<unk>"}))
    return tokenizer, AutoTokenizer.from_pretrained(directory)


def test_cleaned_deltas_rebuild_transformers_decode(word_level):
    tokenizer, reference = word_level
    ids = tokenizer.encode(SENTENCE).ids
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True)
    deltas = [detokenizer.feed(token_id) for token_id in ids] + [detokenizer.finish()]
    assert "".join(deltas) == reference.decode(ids) == reference_cleanup(SENTENCE)
    assert deltas[:4] == ["Hello", ",", " world", "."]
    assert deltas[-3:] == ["", "'s", ""]  # " '" may begin " ' ": held until " s" shows it does


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_ids_match_transformers_decode(word_level, data):
    tokenizer, reference = word_level
    ids = data.draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1), max_size=30))
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True)
    streamed = "".join(detokenizer.feed(token_id) for token_id in ids) + detokenizer.finish()
    assert streamed == reference.decode(ids)


def test_without_the_setting_text_is_not_cleaned(word_level):
    tokenizer, _ = word_level
    ids = tokenizer.encode(SENTENCE).ids
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join(detokenizer.feed(token_id) for token_id in ids) + detokenizer.finish() == SENTENCE


def test_finish_releases_the_held_space(word_level):
    tokenizer, _ = word_level
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True)
    hello, quote = tokenizer.encode("Hello '").ids
    assert detokenizer.feed(hello) == "Hello"
    assert detokenizer.feed(quote) == ""
    assert detokenizer.fixed_open_text() == ""  # no id is pending: the held text is not open text
    assert detokenizer.finish() == " '"


def _served(tokenizer: Tokenizer, frontend_extra: dict):
    from helios.frontend.session import FrontendModel

    from .served import served_contract

    frontend = {"tool_parser": "TOOL_PARSER_NONE", "reasoning_parser": "REASONING_PARSER_NONE",
                "assistant_boundary": {"message_start": "", "message_end": "</s>", "assistant_header": "A:"},
                **frontend_extra}
    eos = tokenizer.token_to_id("</s>")
    contract = served_contract(tokenizer.get_vocab_size(), frontend, [eos],
                               [{"name": "eos_token", "text": "</s>", "token_id": eos}])
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return FrontendModel.from_contract(contract, tokenizer, template)


@pytest.mark.parametrize("declared", [True, False])
def test_a_core_declaring_the_cleanup_serves_cleaned_text(word_level, declared):
    """A core with `clean_up_tokenization_spaces` serves transformers' decode; one without the field
    (older cores) serves the raw decode, as before."""
    from helios.server.schemas import ChatCompletionRequest

    from .served import run_output

    tokenizer, reference = word_level
    model = _served(tokenizer, {"clean_up_tokenization_spaces": True} if declared else {})
    messages = [{"role": "user", "content": "I"}]
    body = ChatCompletionRequest.model_validate({"model": model.served_id, "messages": messages})
    prepared = model.prepare_chat(body, request_id="r1")
    ids = tokenizer.encode(SENTENCE).ids
    _, final = run_output(prepared, ids)
    text = prepared.response_body(final)["choices"][0]["message"]["content"]
    assert text == (reference.decode(ids) if declared else SENTENCE)


def test_helios_generate_prints_the_cleaned_text(word_level):
    """`helios generate`'s text of an output: cleaned as transformers' decode (skipping special tokens)
    where the core says so, as it was not before the flag reached it."""
    from helios.cli.generate_cmd import _output_text

    tokenizer, reference = word_level
    ids = tokenizer.encode(SENTENCE).ids
    assert _output_text(tokenizer, ids, (), clean_up_spaces=True) == reference.decode(ids, skip_special_tokens=True)
    assert _output_text(tokenizer, ids, ()) == tokenizer.decode(ids) != reference.decode(ids)

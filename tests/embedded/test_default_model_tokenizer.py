"""The shipped tokenizer: byte-level BPE with the chat, think and tool special tokens."""

from __future__ import annotations

import json

import pytest
from default_model_tokenizer import SPECIAL_TOKENS
from tokenizers import Tokenizer

from helios.embedded import default_model_dir


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))


def test_special_tokens_have_ids_zero_to_eight_and_encode_as_one_token(tokenizer):
    assert [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    added = {entry["content"]: entry for entry in json.loads(tokenizer.to_str())["added_tokens"]}
    for token in SPECIAL_TOKENS:
        assert added[token]["special"] is True
        assert tokenizer.encode(f"a{token}b").tokens[1] == token


def test_digits_are_single_tokens(tokenizer):
    assert tokenizer.encode("12345").tokens == ["1", "2", "3", "4", "5"]
    for token in tokenizer.get_vocab():
        if any(char.isdigit() for char in token):
            assert len(token) == 1, token


def test_any_text_round_trips(tokenizer):
    text = "Grüße, 東京! émoji 🙂 tabs\tand\nnewlines <think>x</think> 3.14"
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_vocabulary_is_small_and_config_names_eos_and_pad(tokenizer):
    assert tokenizer.get_vocab_size() <= 1024
    config = json.loads((default_model_dir() / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["pad_token"], config["bos_token"]) == ("<|im_end|>", "<|pad|>", None)
    model_config = json.loads((default_model_dir() / "config.json").read_text())
    assert model_config["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    assert model_config["vocab_size"] == tokenizer.get_vocab_size()

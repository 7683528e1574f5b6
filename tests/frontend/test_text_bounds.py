"""Request text bounds: lone surrogates are refused, and text that cannot fit the context extent is
refused before tokenizing, with a bound derived from the vocabulary."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from helios.cli.generate_cmd import _prompt_ids
from helios.errors import UsageError
from helios.frontend.decoding.text_bounds import PromptTooLong, TextBounds, TextNotUnicode, strings_of

TOKENIZER = Path(__file__).resolve().parents[2] / "src/helios/embedded/default_model/tokenizer.json"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(TOKENIZER))


def test_the_bound_is_context_times_the_longest_token(tokenizer):
    longest = max(len(token) for token in tokenizer.get_vocab(with_added_tokens=True))
    bounds = TextBounds.from_tokenizer(tokenizer, 100)
    assert bounds.max_text_chars == 100 * longest
    # the bound is sound: text this long never fits in fewer tokens than the context holds
    text = "the quick brown fox " * (bounds.max_text_chars // 20 + 1)
    assert len(tokenizer.encode(text).ids) > 100


def test_text_over_the_bound_or_not_unicode_is_refused(tokenizer):
    bounds = TextBounds.from_tokenizer(tokenizer, 10)
    bounds.check(["a" * (bounds.max_text_chars // 2)] * 2)
    with pytest.raises(PromptTooLong):
        bounds.check(["a" * (bounds.max_text_chars // 2)] * 2 + ["b"])
    with pytest.raises(TextNotUnicode, match="lone surrogate"):
        bounds.check(["fine", "bad \ud800"])
    assert PromptTooLong.http_status == 400 and TextNotUnicode.http_status == 400


def test_strings_of_walks_keys_and_values_without_recursion():
    nested = current = []
    for _ in range(10_000):
        current.append([])
        current = current[0]
    current.append({"k": "v"})
    assert sorted(strings_of([nested, {"a": ["b", {"c": None}]}])) == ["a", "b", "c", "k", "v"]


def test_generate_refuses_prompts_that_are_not_utf8(tokenizer):
    args = Namespace(prompts=["caf\udce9"], prompt_ids=None, chat=False)  # b"caf\xe9" through surrogateescape
    with pytest.raises(UsageError, match="not valid UTF-8"):
        _prompt_ids(args, tokenizer, "", {})

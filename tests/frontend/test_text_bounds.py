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


def _tiny(vocab: list[str], **model) -> Tokenizer:
    """A BPE tokenizer over `vocab` (each longer token merged from its first character and the rest,
    where both are tokens), with an unknown token ``?`` unless `model` says otherwise (without
    one, a BPE drops the characters it lacks; one character long, it lengthens no bound)."""
    from tokenizers.models import BPE

    if "unk_token" not in model:
        vocab, model = ["?", *vocab], {**model, "unk_token": "?"}
    elif model["unk_token"] is None:
        del model["unk_token"]
    merges = [(token[0], token[1:]) for token in vocab if token[0] in vocab and token[1:] in vocab]
    return Tokenizer(BPE({token: i for i, token in enumerate(vocab)}, merges, **model))


def _fits(tokenizer: Tokenizer, text: str, context_tokens: int) -> bool:
    return len(tokenizer.encode(text, add_special_tokens=False).ids) <= context_tokens


def test_a_composing_normalizer_is_allowed_for():
    """NFC composes up to four code points into one (U + diaeresis + macron is one Ǖ): text of more
    code points than the context's tokens can spell still fits, and is not refused."""
    from tokenizers import normalizers

    tokenizer = _tiny(["Ǖ", "ǕǕ"])
    tokenizer.normalizer = normalizers.NFC()
    text = "U\u0308\u0304" * 10  # 30 code points, 10 characters once composed: 5 tokens
    assert _fits(tokenizer, text, 10)
    TextBounds.from_tokenizer(tokenizer, 10).check([text])
    with pytest.raises(PromptTooLong):  # still a bound: 4 code points a character, 2 characters a token
        TextBounds.from_tokenizer(tokenizer, 10).check(["U\u0308\u0304" * 27])


def test_white_space_an_added_token_strips_is_not_counted():
    """An added token with rstrip or lstrip (Phi-3's chat markers) takes any white space beside it
    into its one token, so white space cannot count toward the bound; other text still does."""
    from tokenizers import AddedToken

    tokenizer = _tiny(["a", "b"])
    tokenizer.add_special_tokens([AddedToken("<|user|>", rstrip=True, normalized=False)])
    text = "<|user|>" + " \n" * 100 + "a"  # 2 tokens
    assert _fits(tokenizer, text, 10)
    bounds = TextBounds.from_tokenizer(tokenizer, 10)
    bounds.check([text, "\t" * 500])
    with pytest.raises(PromptTooLong):
        bounds.check(["ab" * 41])


@pytest.mark.parametrize("component", ["replace", "strip_accents", "fused_unk", "bpe_without_unk"])
def test_no_bound_where_the_tokenizer_can_drop_any_text(component):
    """A normalizer that can replace text with nothing, or a model that reads any run of unknown
    characters as one token, makes any length of text fit: there is no bound before tokenizing."""
    from tokenizers import normalizers

    if component == "fused_unk":
        tokenizer, text = _tiny(["<unk>", "a"], unk_token="<unk>", fuse_unk=True), "a" + "\x00" * 2000
    elif component == "bpe_without_unk":  # characters it lacks are dropped
        tokenizer, text = _tiny(["a"], unk_token=None), "a" + "z" * 2000
    else:
        tokenizer, text = _tiny(["a"]), "a" + "\u0301" * 2000
        tokenizer.normalizer = (normalizers.Replace("\u0301", "") if component == "replace"
                                else normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()]))
    assert _fits(tokenizer, text, 10)
    bounds = TextBounds.from_tokenizer(tokenizer, 10)
    assert bounds.max_text_chars is None
    bounds.check([text])
    with pytest.raises(TextNotUnicode):
        bounds.check(["\ud800"])

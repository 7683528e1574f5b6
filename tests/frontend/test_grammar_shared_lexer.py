"""A request's matcher meets llguidance's limits for its own work only, never for the work of the
copies made from it (`GrammarMatcher`: llguidance's `deep_copy` shares the lexer, its states and its
sticky error). `MASK_LIMIT` (twelve letters, then 1,500 terminals) meets the lexer's step fuel at the
mask after its twelfth letter, alone.

Before, a trial copy's mask one letter ahead (`fill_draft_bitmasks` with a one-letter draft) met that
limit and left the error in the shared lexer: the request failed as it took its twelfth letter, one
token sooner than its own tokens justify; a `fork` walked to its limit ended the matcher it came from
at that matcher's first mask."""

from __future__ import annotations

import numpy as np
import pytest

from helios.frontend.structured.grammar import GrammarCompiler, GrammarKind, GrammarMatcher, GrammarRequest
from server.test_grammar_limit_http import MASK_LIMIT
from support.chat_checkpoint import train_tokenizer

LIMIT = "lexer error: too many expressions constructed"
OWN_LETTERS = 12  # the letters `MASK_LIMIT` takes before its own mask meets the limit


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    tokenizer = train_tokenizer()
    eos = tokenizer.token_to_id("<|im_end|>")
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])


@pytest.fixture(scope="module")
def letter(compiler) -> int:
    return next(i for i in range(compiler.mask_words * 32) if compiler.token_bytes(i) == b"b")


def limited(compiler) -> GrammarMatcher:
    return compiler.compile(GrammarRequest(GrammarKind.LARK, MASK_LIMIT["grammar"]))


def letters_until_the_limit(matcher: GrammarMatcher, letter: int, draft: bool = False) -> int:
    """How many letters `matcher` takes before it meets a limit (at a mask or at a token), each step
    first computing the masks of a one-letter draft when `draft` is set; asserts the limit met."""
    rows = np.empty((2, matcher.bitmask().size), dtype=np.int32)
    for taken in range(40):
        matcher.bitmask()
        if matcher.is_error:
            break
        if draft:
            matcher.fill_draft_bitmasks([letter], rows)
        if not matcher.consume_token(letter):
            break
    assert matcher.error.startswith(LIMIT), matcher.error
    return taken


def test_the_grammar_meets_its_own_limit_after_twelve_letters(compiler, letter):
    assert letters_until_the_limit(limited(compiler), letter) == OWN_LETTERS


def test_draft_masks_that_meet_a_limit_do_not_end_the_request_sooner(compiler, letter):
    assert letters_until_the_limit(limited(compiler), letter, draft=True) == OWN_LETTERS


def test_a_fork_walked_to_its_limit_leaves_the_matcher_it_came_from_its_own_limit(compiler, letter):
    matcher = limited(compiler)
    fork = matcher.fork()
    assert letters_until_the_limit(fork, letter) == OWN_LETTERS
    assert letters_until_the_limit(matcher, letter) == OWN_LETTERS


def test_forks_of_one_compile_each_meet_their_own_limit(compiler, letter):
    """A response's choices may each take a fork of one compiled matcher: the first to meet its
    limit ends none of the others."""
    first = limited(compiler)
    choices = [first.fork() for _ in range(3)]
    assert [letters_until_the_limit(choice, letter) for choice in choices] == [OWN_LETTERS] * 3
    assert letters_until_the_limit(first, letter) == OWN_LETTERS


def test_the_grammar_is_compiled_again_only_where_a_shared_lexer_met_a_limit(compiler, letter):
    matcher = limited(compiler)
    builds = []
    rebuild = matcher._rebuild
    matcher._rebuild = lambda: builds.append(1) or rebuild()
    rows = np.empty((2, compiler.mask_words), dtype=np.int32)
    for _ in range(OWN_LETTERS - 1):
        matcher.fill_draft_bitmasks([letter], rows)
        assert matcher.consume_token(letter)
    assert builds == []  # no limit met yet: no compile on the common path
    matcher.fill_draft_bitmasks([letter], rows)  # its draft's mask meets the limit on the shared lexer
    assert matcher.consume_token(letter) and builds == [1]
    matcher.bitmask()
    assert matcher.error.startswith(LIMIT) and builds == [1]  # its own limit: not built again

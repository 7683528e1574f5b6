"""A grammar that reaches a dead end while decoding (no token can follow an output that is not
complete) ends its request cleanly: finish GRAMMAR_DEAD_END with the output so far, never the token
the grammar's error mask forces, never an error, and the request beside it runs on untouched.

A dead end can reach the runtime although the compile check searches for one: the check passes a
grammar with a live branch (`helios.frontend.structured.dead_ends`), a sampled output may take the
dead one, and a dead end deeper than the check looks is not seen at all. Before, llguidance's error
mask let the lane sample EOS only, and consuming it failed the request as an execution error
(HTTP 500) after that EOS had been reported as an output token.

The matchers here follow llguidance's contract (never raise; a sticky error state found by the
mask, whose mask allows only EOS), so the point where the dead end appears is exact; a real
matcher shows the same state (`GrammarMatcher.is_dead_end`)."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import decoders

from helios.frontend.structured.grammar import GrammarCompiler, GrammarKind, GrammarRequest
from helios.runtime.feedback import TensorGrammar
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.service import build_runtime
from runtime.test_model_fixture import open_fixture
from support.scripted_grammar import EOS, ScriptedMatcher, run_beside, tokens_of

from .test_logprob_offsets_spm import sentencepiece_like

DEAD_END = "NoExtensionBias\n<state>\nTokens: ..."


def dead_end_after(num_fine: int) -> ScriptedMatcher:
    """Allows every token until `num_fine` were consumed; the mask after them finds a dead end (the
    sticky error state, its mask allowing only EOS)."""
    return ScriptedMatcher(num_fine, DEAD_END, on_fill=True)


@pytest.fixture(scope="module")
def engine():
    """One engine serves the module's requests (a runtime build each cost half a second); each test
    checks the counts its own requests added, and that the engine serves on after them."""
    return build_runtime(open_fixture()).engine


@pytest.mark.parametrize("num_fine", [0, 1, 3])
def test_a_dead_end_ends_the_request_with_its_output_so_far(engine, num_fine):
    finished = dict(engine.stats.requests_finished)
    matcher = dead_end_after(num_fine)
    grammar, beside = run_beside(engine, matcher)
    finish = [e for e in grammar if isinstance(e, FinishEvent)]
    assert len(finish) == 1 and finish[0].reason is FinishReason.GRAMMAR_DEAD_END
    assert tokens_of(grammar) == matcher.consumed and len(matcher.consumed) == num_fine  # no forced EOS
    assert finish[0].num_output_tokens == num_fine and matcher.num_masks == num_fine + 1
    assert grammar[-1] is finish[0]
    assert beside[-1].reason is FinishReason.LENGTH and len(tokens_of(beside)) == 8
    stats = engine.stats
    assert stats.requests_finished["grammar_dead_end"] == finished.get("grammar_dead_end", 0) + 1
    assert stats.requests_finished.get("error", 0) == finished.get("error", 0)
    assert not engine.feedback.watching and stats.healthy
    _, again = run_beside(engine, dead_end_after(100))  # the engine serves on, a live grammar too
    assert again[-1].reason is FinishReason.LENGTH


def test_a_real_matcher_reports_the_dead_end_its_mask_found():
    tokenizer = sentencepiece_like(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)]))
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[EOS])
    matcher = compiler.compile(GrammarRequest(GrammarKind.LARK, 'start: "a" /[^\\s\\S]/ | "b"'))
    grammar = TensorGrammar(matcher)
    assert not grammar.is_dead_end
    assert matcher.consume_token(tokenizer.token_to_id("a"))
    assert not matcher.is_dead_end  # found by the next mask
    mask = matcher.bitmask()
    assert matcher.is_dead_end and grammar.is_dead_end
    allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:tokenizer.get_vocab_size()])
    assert allowed.tolist() == [EOS]  # what the lane would have had to sample


def test_text_the_vocabulary_cannot_spell_is_a_dead_end_not_an_unknown_word_token():
    """Where the grammar needs "\u00e9" and the vocabulary (no byte fallback) has no token for it,
    llguidance's mask allows the unknown-word token instead of finding a dead end, and refuses that
    token when it comes: the lane would write "<unk>" and then fail with a 500. The matcher reports
    the mask as the dead end it is."""
    from .test_grammar_dead_ends import small_vocabulary_compiler

    compiler, _ = small_vocabulary_compiler()
    matcher = compiler.compile(GrammarRequest(GrammarKind.LARK, 'start: /[bc]{4}/ "\u00e9" | "0"'))
    b = next(i for i in range(compiler._vocab_size) if compiler.token_bytes(i) == b"b")
    for _ in range(4):
        matcher.bitmask()
        assert not matcher.is_dead_end
        assert matcher.consume_token(b)
    mask = matcher.bitmask()
    allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:compiler._vocab_size])
    assert not matcher.is_error and len(allowed) == 1 and compiler.is_special_token(int(allowed[0]))
    assert matcher.is_dead_end and TensorGrammar(matcher).is_dead_end
    assert not matcher.fork().consume_token(int(allowed[0]))  # what the lane would have met

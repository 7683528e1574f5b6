"""A grammar matcher that enters its sticky error state while decoding (llguidance's lexer limits
reached deep in the output) ends its request with an ERROR finish worded for the client, never a
normal stop; the request beside it runs on untouched.

The matchers here follow llguidance's contract (never raise; a sticky error state whose mask allows
only EOS) and go wrong on cue, so the point where the error appears is exact.
"""

from __future__ import annotations

import pytest

from helios.runtime.feedback import GrammarFailure, TensorGrammar
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.service import build_runtime
from support.scripted_grammar import EOS, ScriptedMatcher, run_beside, tokens_of

from .test_model_fixture import open_fixture

LIMIT_ERROR = "lexer error: too many states: 50000 >= 50000\n<state>\nTokens: ..."


def limited(num_fine: int, on_fill: bool = False) -> ScriptedMatcher:
    """Allows every token until `num_fine` tokens were consumed (`on_fill`: until the mask after
    them), then is in the error state of a lexer limit for good, its mask allowing only EOS."""
    return ScriptedMatcher(num_fine, LIMIT_ERROR, on_fill)


@pytest.fixture
def engine():
    return build_runtime(open_fixture()).engine


def test_an_error_state_reached_by_a_token_ends_the_request_as_an_error(engine):
    matcher = limited(num_fine=3)
    grammar, beside = run_beside(engine, matcher)
    finish = [e for e in grammar if isinstance(e, FinishEvent)]
    assert len(finish) == 1 and finish[0].reason is FinishReason.ERROR
    assert finish[0].message.startswith("the output grammar failed during decoding")
    assert "too many states: 50000 >= 50000" in finish[0].message and "<state>" not in finish[0].message
    assert len(matcher.consumed) == 4 and tokens_of(grammar) == matcher.consumed  # it ends at the 4th token
    assert beside[-1].reason is FinishReason.LENGTH and len(tokens_of(beside)) == 8
    assert engine.stats.requests_finished["error"] == 1 and not engine.feedback.watching


def test_an_error_state_reached_by_a_mask_ends_the_request_as_an_error_not_an_eos_stop(engine):
    """The mask computed in the error state allows only EOS: the lane samples it, and consuming it
    reports the error instead of ending the request as if its answer were complete."""
    matcher = limited(num_fine=2, on_fill=True)
    grammar, beside = run_beside(engine, matcher)
    finish = [e for e in grammar if isinstance(e, FinishEvent)]
    assert len(finish) == 1 and finish[0].reason is FinishReason.ERROR and "too many states" in finish[0].message
    assert tokens_of(grammar) == [*matcher.consumed, EOS] and len(matcher.consumed) == 2
    assert beside[-1].reason is FinishReason.LENGTH


def test_tensor_grammar_passes_tokens_through_until_the_error_state():
    matcher = limited(num_fine=1)
    grammar = TensorGrammar(matcher)
    assert grammar.consume_token(7) is True
    with pytest.raises(GrammarFailure, match="too many states") as caught:
        grammar.consume_token(8)
    assert caught.value.http_status == 500

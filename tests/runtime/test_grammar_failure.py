"""`TensorGrammar` over a matcher that enters its sticky error state when it consumes a token
(llguidance's lexer limits reached deep in the output): it raises `GrammarFailure`, worded for the
client. How the engine ends such a request (GRAMMAR_LIMIT with the tokens its grammar took, never the
refused token or the error mask's EOS) is `tests/frontend/test_grammar_limit_runtime.py`'s.

The matchers here follow llguidance's contract (never raise; a sticky error state whose mask allows
only EOS) and go wrong on cue, so the point where the error appears is exact.
"""

from __future__ import annotations

import pytest

from helios.runtime.feedback import GrammarFailure, TensorGrammar
from support.scripted_grammar import ScriptedMatcher

LIMIT_ERROR = "lexer error: too many states: 50000 >= 50000\n<state>\nTokens: ..."


def limited(num_fine: int, on_fill: bool = False) -> ScriptedMatcher:
    """Allows every token until `num_fine` tokens were consumed (`on_fill`: until the mask after
    them), then is in the error state of a lexer limit for good, its mask allowing only EOS."""
    return ScriptedMatcher(num_fine, LIMIT_ERROR, on_fill)


def test_tensor_grammar_passes_tokens_through_until_the_error_state():
    matcher = limited(num_fine=1)
    grammar = TensorGrammar(matcher)
    assert grammar.consume_token(7) is True
    with pytest.raises(GrammarFailure, match="too many states") as caught:
        grammar.consume_token(8)
    assert caught.value.http_status == 500
    assert caught.value.reason == "lexer error: too many states: 50000 >= 50000"  # its first line only

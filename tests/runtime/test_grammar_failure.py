"""A grammar matcher that enters its sticky error state while decoding (llguidance's lexer limits
reached deep in the output) ends its request with an ERROR finish worded for the client, never a
normal stop; the request beside it runs on untouched.

The matchers here follow llguidance's contract (never raise; a sticky error state whose mask allows
only EOS) and go wrong on cue, so the point where the error appears is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from helios.runtime.engine import EngineRequest
from helios.runtime.feedback import GrammarFailure, TensorGrammar
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import build_runtime

from .test_model_fixture import open_fixture

PROMPT = (5, 9, 14, 3, 22, 7)
EOS = 2
LIMIT_ERROR = "lexer error: too many states: 50000 >= 50000\n<state>\nTokens: ..."


class LimitedMatcher:
    """Allows every token until `num_fine` tokens were consumed (`on_fill`: until the mask after
    them), then is in the error state for good, its mask allowing only EOS."""

    def __init__(self, num_fine: int, on_fill: bool = False):
        self.num_fine, self.on_fill = num_fine, on_fill
        self.consumed: list[int] = []
        self.error = ""

    @property
    def is_error(self) -> bool:
        return bool(self.error)

    def fill_bitmask(self, out: np.ndarray) -> None:
        if self.on_fill and len(self.consumed) >= self.num_fine:
            self.error = LIMIT_ERROR
        out[:] = -1
        if self.error:
            out[:] = 0
            out[EOS // 32] = np.int32(1 << (EOS % 32))

    def consume_token(self, token_id: int) -> bool:
        if self.error:
            return False
        self.consumed.append(token_id)
        if not self.on_fill and len(self.consumed) > self.num_fine:
            self.error = LIMIT_ERROR
            return False
        return True


@pytest.fixture
def engine():
    return build_runtime(open_fixture()).engine


def run(engine, matcher: LimitedMatcher, max_tokens: int = 8):
    grammar, beside = [], []
    engine.submit(EngineRequest(RequestSpec("g", PROMPT, max_tokens, frozenset({EOS}), constrained=True),
                                grammar.append, grammar=TensorGrammar(matcher)))
    engine.submit(EngineRequest(RequestSpec("b", PROMPT, max_tokens), beside.append))
    engine.run_until_idle()
    return grammar, beside


def tokens_of(events) -> list[int]:
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]


def test_an_error_state_reached_by_a_token_ends_the_request_as_an_error(engine):
    matcher = LimitedMatcher(num_fine=3)
    grammar, beside = run(engine, matcher)
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
    matcher = LimitedMatcher(num_fine=2, on_fill=True)
    grammar, beside = run(engine, matcher)
    finish = [e for e in grammar if isinstance(e, FinishEvent)]
    assert len(finish) == 1 and finish[0].reason is FinishReason.ERROR and "too many states" in finish[0].message
    assert tokens_of(grammar) == [*matcher.consumed, EOS] and len(matcher.consumed) == 2
    assert beside[-1].reason is FinishReason.LENGTH


def test_tensor_grammar_passes_tokens_through_until_the_error_state():
    matcher = LimitedMatcher(num_fine=1)
    grammar = TensorGrammar(matcher)
    assert grammar.consume_token(7) is True
    with pytest.raises(GrammarFailure, match="too many states") as caught:
        grammar.consume_token(8)
    assert caught.value.http_status == 500

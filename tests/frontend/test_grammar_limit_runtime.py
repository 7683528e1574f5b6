"""A grammar that meets one of llguidance's limits while decoding (its matcher refuses to go on past
the output, for a reason other than a dead end) ends its request cleanly: finish GRAMMAR_LIMIT with
exactly the tokens the grammar took, never the token the error mask forces nor the token the matcher
refused; met before any output token, an ERROR whose message names the limit. The request beside it
runs on untouched, also beside speculating lanes and under preemption.

Before, a limit met at a mask let the lane sample the error mask's EOS, which was delivered as an
output token before consuming it failed the request (ERROR, HTTP 500); a limit met when a token was
consumed delivered that token first, then failed the request the same way.

The scripted matchers follow llguidance's contract (never raise; a sticky error state, whose mask
allows only EOS, met at a mask or at a token), so the point where the limit shows is exact; the real
grammars of `tests/server/test_grammar_limit_http.py` meet both over HTTP."""

from __future__ import annotations

import pytest
import torch

from helios.frontend.structured.grammar import GrammarCompiler, GrammarKind, GrammarRequest
from helios.ignition.recipes import load_checkpoint
from helios.runtime.feedback import Advance, GrammarFailure, LaneFeedback, TensorGrammar
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import build_runtime
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint
from runtime.test_grammar_dead_end_speculation import events_beside_plain, speculating_engine
from runtime.test_model_fixture import open_fixture
from support.scripted_grammar import EOS, ScriptedMatcher, run_beside, tokens_of

LIMIT = "lexer error: too many states: 50000 >= 50000\n<state>\nTokens: ..."
REASON = "lexer error: too many states: 50000 >= 50000"  # what a client may read of it


def limited(num_fine: int, on_fill: bool, allows_eos: bool = True) -> ScriptedMatcher:
    """Takes every token until `num_fine` were consumed; then meets a lexer limit at the next token
    (`on_fill` False: that token is refused) or at the mask after them (`on_fill` True)."""
    return ScriptedMatcher(num_fine, LIMIT, on_fill=on_fill, allows_eos=allows_eos)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3_UNTIED), tmp_path_factory.mktemp("llama3")))


@pytest.fixture(scope="module")
def engine():
    """One engine serves the module's requests (a runtime build each cost half a second); each test
    checks the counts its own requests added, and that the engine serves on after them."""
    return build_runtime(open_fixture()).engine


def counts(engine) -> tuple[dict[str, int], int]:
    """The engine's finished-request counts by reason and its generated tokens so far."""
    return dict(engine.stats.requests_finished), engine.stats.generated_tokens


def the_finish(events) -> FinishEvent:
    finishes = [e for e in events if isinstance(e, FinishEvent)]
    assert len(finishes) == 1 and events[-1] is finishes[0], events
    return finishes[0]


@pytest.mark.parametrize("on_fill", [False, True], ids=["at-a-token", "at-a-mask"])
@pytest.mark.parametrize("num_fine", [1, 3])
def test_a_limit_mid_output_ends_the_request_with_the_tokens_its_grammar_took(engine, num_fine, on_fill):
    finished, generated = counts(engine)
    matcher = limited(num_fine, on_fill)
    grammar, beside = run_beside(engine, matcher)
    finish = the_finish(grammar)
    assert finish.reason is FinishReason.GRAMMAR_LIMIT and finish.message == REASON
    taken = matcher.consumed[:num_fine]  # at a token, the matcher was handed the token it refused
    assert tokens_of(grammar) == taken and EOS not in taken  # no forced EOS, no refused token
    assert finish.num_output_tokens == num_fine
    assert matcher.num_masks == num_fine + 1
    assert beside[-1].reason is FinishReason.LENGTH and len(tokens_of(beside)) == 8
    stats = engine.stats
    assert stats.requests_finished["grammar_limit"] == finished.get("grammar_limit", 0) + 1
    assert stats.requests_finished.get("error", 0) == finished.get("error", 0)
    assert stats.generated_tokens == generated + num_fine + 8  # the refused or forced token is never counted
    assert not engine.feedback.watching and stats.healthy
    _, again = run_beside(engine, limited(100, on_fill))  # the engine serves on, a live grammar too
    assert again[-1].reason is FinishReason.LENGTH


@pytest.mark.parametrize("on_fill", [False, True], ids=["at-a-token", "at-a-mask"])
def test_a_limit_before_any_output_is_an_error_that_names_it(engine, on_fill):
    finished, generated = counts(engine)
    matcher = limited(0, on_fill)
    grammar, beside = run_beside(engine, matcher)
    finish = the_finish(grammar)
    assert finish.reason is FinishReason.ERROR and finish.num_output_tokens == 0 and tokens_of(grammar) == []
    assert finish.message == f"the output grammar exceeded llguidance's limits before any output: {REASON}"
    assert beside[-1].reason is FinishReason.LENGTH and len(tokens_of(beside)) == 8
    assert engine.stats.requests_finished["error"] == finished.get("error", 0) + 1
    assert engine.stats.generated_tokens == generated + 8


class _Refusing:
    """A grammar hook that refuses its third token (for `LaneFeedback.advance` alone)."""

    def __init__(self):
        self.consumed = []

    def consume_token(self, token_id: int) -> bool:
        self.consumed.append(token_id)
        if len(self.consumed) == 3:
            raise GrammarFailure("parser error: Too many items (limit 50000; ff_tokens)")
        return True

    def fill_bitmask(self, row) -> None:
        row[:] = -1


def test_advance_takes_ids_until_the_grammar_refuses_one_and_feeds_none_after():
    feedback = LaneFeedback(mask_words=4)
    grammar, stopped = _Refusing(), []
    feedback.register("r", grammar, lambda token_id: stopped.append(token_id) or False)
    assert feedback.advance("r", (10, 11)) is None
    assert feedback.advance("r", (12, 13, 14)) == Advance(0, failure="parser error: Too many items (limit 50000; ff_tokens)")
    assert grammar.consumed == [10, 11, 12] and stopped == [10, 11]  # the host stop never saw 12
    feedback.register("s", None, lambda token_id: token_id == 21)
    assert feedback.advance("s", (20, 21, 22)) == Advance(2, is_stopped=True)


def test_a_real_matcher_reports_a_limit_at_its_mask_and_at_a_token():
    """llguidance meets its limits both ways: the lexer's expression limit while it computes a mask
    (the 1,500 terminals after the letters), its state limit when it consumes the "a" after which a
    hundred thousand bytes are forced."""
    from server.test_grammar_limit_http import MASK_LIMIT, TOKEN_LIMIT
    from support.chat_checkpoint import train_tokenizer

    tokenizer = train_tokenizer()
    eos = tokenizer.token_to_id("<|im_end|>")
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])
    letter = tokenizer.token_to_id("b")
    at_mask = TensorGrammar(compiler.compile(GrammarRequest(GrammarKind.LARK, MASK_LIMIT["grammar"])))
    at_token = TensorGrammar(compiler.compile(GrammarRequest(GrammarKind.LARK, TOKEN_LIMIT["grammar"])))
    row = torch.empty(compiler.mask_words, dtype=torch.int32)
    for _ in range(12):
        at_mask.fill_bitmask(row)
        assert at_mask.limit == ""
        at_mask.consume_token(letter)
    at_mask.fill_bitmask(row)
    assert at_mask.limit == "lexer error: too many expressions constructed" and not at_mask.is_dead_end
    for _ in range(40):
        at_token.consume_token(letter)
    at_token.fill_bitmask(row)
    assert at_token.limit == ""
    with pytest.raises(GrammarFailure) as caught:
        at_token.consume_token(tokenizer.token_to_id("a"))
    assert caught.value.reason.startswith("lexer error: too many states") and "<state>" not in caught.value.reason


@pytest.mark.parametrize("num_pages", [None, 18], ids=["pages-to-spare", "preempting"])
def test_a_limit_beside_speculating_lanes_drops_its_token_and_touches_none(recipe, num_pages):
    engine, plans = speculating_engine(recipe, num_pages)
    plain = [RequestSpec(f"p{i}", tuple(range(5 + i, 25 + i)), 14, frozenset({EOS})) for i in range(3)]
    matchers = {f"g{k}{'m' if on_fill else 't'}": limited(k, on_fill, allows_eos=False)
                for k in (1, 6) for on_fill in (False, True)}
    constrained = [(RequestSpec(name, tuple(range(40, 52)), 14, frozenset({EOS}), constrained=True),
                    TensorGrammar(matcher)) for name, matcher in matchers.items()]
    events = events_beside_plain(engine, recipe, plain, constrained)
    for name, matcher in matchers.items():
        finish = the_finish(events[name])
        assert finish.reason is FinishReason.GRAMMAR_LIMIT and finish.num_output_tokens == matcher.num_fine
        assert tokens_of(events[name]) == matcher.consumed[:matcher.num_fine]
    assert any(p.operation == Operation.SPECULATIVE and {r.request_id for r in p.rows} & set(matchers)
               for p in plans), [p.operation for p in plans]
    counters = engine.scheduler.counters()
    assert (counters.preemptions > 0) == (num_pages is not None), counters
    assert counters.num_running == counters.num_waiting == 0 and not engine.feedback.watching
    assert engine.stats.requests_finished["grammar_limit"] == len(matchers) and engine.stats.healthy

"""Real llguidance matchers whose grammar ends deep in the output, in plans that speculate and
preempt, with sibling choices (``n``: the same prompt, its pages shared): a dead end deeper than the
compile check looks ends GRAMMAR_DEAD_END, a limit met deep in the output GRAMMAR_LIMIT, each with
exactly the tokens its grammar took, and the lanes beside them (drafting and verifying in the same
plans, a plain sibling of the same prompt among them) keep the outputs they have alone.

No draft token is ever proposed into a grammar's dead end: a constrained lane is single-lane (its
mask needs the token before it), so in a SPECULATIVE plan its row may emit one token while the
lanes beside it verify drafts; the test checks that of every plan. The scripted matchers of
`tests/runtime/test_grammar_dead_end_speculation.py` place the end exactly; these are the grammars
a client sends (`test_grammar_dead_end_http.DEEP_DEAD_END`, a late limit as in
`test_grammar_limits.LATE_LIMIT`), over the stress model's 128-id vocabulary."""

from __future__ import annotations

import re

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from helios.frontend.structured.grammar import GrammarCompiler, GrammarKind, GrammarRequest
from helios.ignition.recipes import load_checkpoint
from helios.runtime.feedback import TensorGrammar
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.records.request import RequestSpec
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint
from runtime.test_grammar_dead_end_speculation import events_beside_plain, speculating_engine
from support.chat_checkpoint import train_tokenizer
from support.scripted_grammar import EOS, tokens_of

VOCAB = 128  # `hf_checkpoints`' models; the chat tokenizer's first 128 ids hold every ASCII character
DEEP_DEAD_END = "start: /[b-z]{12}/ /[^\\s\\S]/"  # passes the check: its dead end lies past the walk
DEEP_LIMIT = "start: /[b-z]{12}/ /a{100000}/"  # the "a" after the letters forces 99,999 lexer states
ENDINGS = {DEEP_DEAD_END: FinishReason.GRAMMAR_DEAD_END, DEEP_LIMIT: FinishReason.GRAMMAR_LIMIT}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3_UNTIED), tmp_path_factory.mktemp("llama3")))


def character_tokenizer() -> Tokenizer:
    """The chat tokenizer's first `VOCAB` ids (its special tokens, then one byte-level character
    each, every ASCII one among them) as a tokenizer of their own: no merges."""
    chat = train_tokenizer()
    tokenizer = Tokenizer(models.BPE({chat.id_to_token(i): i for i in range(VOCAB)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(chat.id_to_token(i), special=True)
                                  for i in range(VOCAB) if chat.id_to_token(i).startswith("<")])
    return tokenizer


@pytest.fixture(scope="module")
def grammars():
    """(compiler, tokenizer) over the stress model's vocabulary, EOS its id 2 (as `scripted_grammar`'s)."""
    tokenizer = character_tokenizer()
    assert tokenizer.get_vocab_size() == VOCAB
    assert tokenizer.encode("bz").ids == [tokenizer.token_to_id("b"), tokenizer.token_to_id("z")]
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=VOCAB, eos_token_ids=[EOS]), tokenizer


@pytest.mark.parametrize("num_pages", [None, 18], ids=["pages-to-spare", "preempting"])
def test_deep_grammar_ends_beside_speculating_lanes_and_siblings_are_clean(recipe, grammars, num_pages):
    compiler, tokenizer = grammars
    engine, plans = speculating_engine(recipe, num_pages)
    prompt = tuple(range(40, 52))
    plain = [RequestSpec(f"p{i}", tuple(range(5 + i, 25 + i)), 24, frozenset({EOS})) for i in range(2)]
    plain.append(RequestSpec("sibling", prompt, 24, frozenset({EOS})))  # a plain choice of the same prompt
    constrained = {f"{kind}{j}": grammar for j in range(2) for kind, grammar in (("dead", DEEP_DEAD_END),
                                                                                   ("limit", DEEP_LIMIT))}
    events = events_beside_plain(engine, recipe, plain, [
        (RequestSpec(name, prompt, 24, frozenset({EOS}), constrained=True),
         TensorGrammar(compiler.compile(GrammarRequest(GrammarKind.LARK, grammar))))
        for name, grammar in constrained.items()])
    for name, grammar in constrained.items():
        finishes = [e for e in events[name] if isinstance(e, FinishEvent)]
        assert [f.reason for f in finishes] == [ENDINGS[grammar]] and events[name][-1] is finishes[0], finishes
        ids = tokens_of(events[name])
        assert re.fullmatch("[b-z]{12}", tokenizer.decode(ids)), (name, tokenizer.decode(ids))  # all it took
        assert finishes[0].num_output_tokens == len(ids)
    speculative = [p for p in plans if p.operation == Operation.SPECULATIVE]
    assert any(r.token_ceiling > 1 for p in speculative for r in p.rows), "no lane drafted"
    assert any(r.request_id in constrained for p in speculative for r in p.rows)
    assert all(r.token_ceiling <= 1 for p in plans for r in p.rows if r.request_id in constrained)
    counters = engine.scheduler.counters()
    assert (counters.preemptions > 0) == (num_pages is not None), counters
    assert counters.num_running == counters.num_waiting == 0 and not engine.feedback.watching
    finished = engine.stats.requests_finished
    assert finished["grammar_dead_end"] == finished["grammar_limit"] == 2 and "error" not in finished
    assert engine.stats.healthy

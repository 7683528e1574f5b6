"""The compile check against a branch whose text is forced and never ends: never a 400 for a
satisfiable grammar, and the limit named where it refuses one.

After "a" in Lark ``("a")* /[^\\s\\S]/`` only "a" can follow, for ever: llguidance forces byte after
byte until its parser's items for the step run out and reports "parser error: Too many items (limit
50000; ff_tokens); try avoiding single-byte/short lexemes" instead of a dead end. The check's walk of
the lowest ids refused every grammar whose lowest ids lead there, although another branch completes:
``start: "d" | ("a")* /[^\\s\\S]/`` was a 400 "exceeds llguidance's limits", with advice about short
lexemes that does not apply. The draws below are those of `test_grammar_dead_ends`' differential
sweep that the check refused so (1 of 2,473 satisfiable grammars on DeepSeek's vocabulary at
``HELIOS_DEAD_END_SEEDS=100``, 8 of 10,019 on the Llama-2-like one at 400; 0 of each now). The search
now treats that limit as a dead end it met (`helios.frontend.structured.dead_ends.is_endless`); a
grammar none of whose outputs completes is still refused for the limit, which the message names, and
says why, and a sampled output that takes the branch ends at run time with finish_reason
``grammar_limit`` (`tests/server/test_grammar_limit_http.py`)."""

from __future__ import annotations

import pytest
import regex

from helios.frontend.structured.dead_ends import is_dead_end, is_endless
from helios.frontend.structured.grammar import GrammarKind, GrammarRequest, failure_reason

from . import test_grammar_dead_ends as dead_ends_tests
from .test_grammar_dead_ends import Alt, Dead, Lit, Rep, Seq, as_regex, is_empty, shortest

compiler = dead_ends_tests.compiler  # DeepSeek's vocabulary and a Llama-2-like one (a module fixture)
verdict = dead_ends_tests.verdict

DEAD = "/[^\\s\\S]/"
X, Y, A, C, D, B = (Lit(char) for char in "xyacdb")
# The satisfiable draws the sweep found refused: each tree (the oracle's) and its Lark text as drawn.
FOUND = [
    (Rep(Seq((Rep(X, "+"), Dead(), Seq((Dead(), Dead())))), "?"), f'start: ((("x")+ {DEAD} ({DEAD} {DEAD})))?\n'),
    (Rep(Seq((Rep(Y, "+"), Dead(), X)), "?"), f'start: ((("y")+ {DEAD} "x"))?\n'),
    (Rep(Seq((Rep(X, "+"), Alt((Dead(), Dead())))), "?"), f'start: ((("x")+ ({DEAD} | {DEAD})))?\n'),
    (Alt((D, Alt((Alt((X, C, Dead())), Seq((Dead(), Dead(), D)))), Seq((Rep(A, "*"), Seq((Dead(), Dead())))))),
     f'start: ("d" | r_2 | (("a")* ({DEAD} {DEAD})))\nr_3: "x" | "c" | {DEAD}\nr_2: r_3 | ({DEAD} {DEAD} "d")\n'),
    (Alt((Seq((Rep(A, "*"), Seq((Dead(), Dead())))), Alt((Rep(Dead(), "?"), Rep(Dead(), "?"))),
          Rep(Seq((Dead(), Dead())), "?"))),
     f'start: ((("a")* ({DEAD} {DEAD})) | r_5 | (({DEAD} {DEAD}))?)\nr_5: ({DEAD})? | ({DEAD})?\n'),
    (Alt((Seq((Rep(X, "*"), Alt((Dead(), Dead())))), Alt((Rep(Dead(), "?"), Rep(Dead(), "?"))))),
     f'start: r_1\nr_4: {DEAD} | {DEAD}\nr_5: ({DEAD})? | ({DEAD})?\nr_1: (("x")* r_4) | r_5\n'),
    (Alt((Rep(Alt((Dead(), Dead())), "?"), Seq((Rep(C, "+"), Alt((Dead(), Dead())))),
          Seq((Seq((Dead(), Dead(), Dead())), Rep(Dead(), "?"), Seq((Dead(), B)))))),
     f'start: ((r_3)? | (("c")+ r_6) | (({DEAD} {DEAD} {DEAD}) ({DEAD})? ({DEAD} "b")))\nr_3: {DEAD} | {DEAD}\n'
     f'r_6: {DEAD} | {DEAD}\n'),
    (Rep(Seq((Rep(A, "*"), Alt((Dead(), Dead(), Dead())), Seq((Dead(), Dead(), Dead())))), "?"),
     f'start: ((("a")* r_4 ({DEAD} {DEAD} {DEAD})))?\nr_4: {DEAD} | {DEAD} | {DEAD}\n'),
    (Alt((D, Seq((Rep(A, "*"), Dead())))), f'start: "d" | ("a")* {DEAD}\n'),
]
# Grammars none of whose outputs completes: each runs into endless forced text (or a dead end).
NEVER_COMPLETE = [
    (Seq((Rep(C, "*"), Dead())), f'start: ("c")* {DEAD}\n'),
    (Seq((X, Rep(Y, "+"), Dead())), f'start: "x" ("y")+ {DEAD}\n'),
    (Seq((Alt((Seq((A, Dead())), Rep(D, "+"))), Dead())), f'start: ("a" {DEAD} | ("d")+) {DEAD}\n'),
]
ENDLESS = "parser error: Too many items (limit 50000; ff_tokens); try avoiding single-byte/short lexemes\n<state>\n"


@pytest.mark.parametrize("index", range(len(FOUND)))
def test_a_satisfiable_grammar_with_an_endless_branch_is_served(compiler, index):
    tree, lark = FOUND[index]
    assert not is_empty(tree) and regex.fullmatch(as_regex(tree), shortest(tree))  # the oracle's member
    for request in (GrammarRequest(GrammarKind.LARK, lark), GrammarRequest(GrammarKind.REGEX, as_regex(tree))):
        assert verdict(compiler, request) == "", request
        compiler.compile(request)


@pytest.mark.parametrize("index", range(len(NEVER_COMPLETE)))
def test_a_grammar_that_never_completes_is_refused_naming_the_limit_and_why(compiler, index):
    tree, lark = NEVER_COMPLETE[index]
    assert is_empty(tree)
    error = verdict(compiler, GrammarRequest(GrammarKind.LARK, lark))
    assert error == ("the lark grammar exceeds llguidance's limits: parser error: Too many items (limit 50000; "
                     "ff_tokens): it forces the text after a token and that text never ends (a repetition beside "
                     "what matches nothing, such as (\"a\")* before [^\\s\\S])"), error


def test_only_the_item_limit_met_forcing_text_is_endless():
    assert is_endless(ENDLESS) and not is_dead_end(ENDLESS)
    assert not is_endless("parser error: Too many items (limit 2000; row)\n<state>\n")
    assert not is_endless("lexer error: too many states: 50000 >= 50000\n<state>\nff_tokens")
    assert not is_endless("NoExtensionBias\n<state>\n")
    assert failure_reason("lexer error: too many states: 50000 >= 50000") == \
        "exceeds llguidance's limits: lexer error: too many states: 50000 >= 50000"

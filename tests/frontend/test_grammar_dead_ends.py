"""The compile check against grammars with dead branches: never a 400 for a satisfiable grammar.

The check walks a grammar's first tokens (the lowest allowed ids). It used to refuse a grammar as a
"dead end" as soon as that walk met a state where no token can follow, although another branch
could complete: Lark ``start: "a" /[^\\s\\S]/ | "b"`` was a 400 because "a" (the lower id) leads
nowhere. Now it searches past the dead end (`helios.frontend.structured.dead_ends`).

Differential test: small grammars are drawn as trees of literals, an empty class (``[^\\s\\S]``, the
dead branch), sequences, alternations and ``? * +`` in random order and nesting, written as a regex
and as a Lark grammar (alternations sometimes hoisted into rules of their own). An independent
oracle decides whether the language is empty (structural recursion over the tree), and for a
non-empty one checks a shortest member with the `regex` package (the regex) and with the Earley
recognizer of `support.format_fuzz` (the grammar). A grammar whose language is non-empty is never
refused; one whose language is empty is refused with the "dead end" message where the search can
see it: when no output it can start (the prefixes of the strings that run into the empty class)
reaches the depth where the walk of the lowest ids passes a grammar (`PROBE_TOKENS`), the search
explores them all within its masks. On a repetition next to what matches nothing llguidance meets
its item limit forcing text that never ends ("Too many items ...; ff_tokens") instead of a dead end:
the search takes it for one (`test_grammar_endless_branch.py`), so a satisfiable grammar is never
refused for it, and an empty one may be refused for that limit rather than as a dead end.

``HELIOS_DEAD_END_SEEDS`` (default 1) multiplies the number of grammars drawn.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

import numpy as np
import pytest
import regex
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from helios.frontend.structured import grammar as grammar_module
from helios.frontend.structured.dead_ends import BranchVocabulary, SearchBudget, allowed_ids, branch_ids, walk
from helios.frontend.structured.grammar import (PROBE_LARK, PROBE_TOKENS, GrammarCompiler,
                                                GrammarError, GrammarKind, GrammarRequest)
from support.format_fuzz import Cfg

from .test_logprob_offsets_spm import sentencepiece_like

SEEDS = int(os.environ.get("HELIOS_DEAD_END_SEEDS", "1"))
CHARS = "abcdxy"
DEAD_CLASS = "[^\\s\\S]"


# -- grammar trees ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    char: str


@dataclass(frozen=True)
class Dead:
    """The empty class: matches no character."""


@dataclass(frozen=True)
class Seq:
    parts: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Rep:
    inner: object
    kind: str  # "?", "*" or "+"


def draw(rng: random.Random, depth: int = 0, repeat: bool = True):
    roll = rng.random()
    if depth < 3 and roll < 0.35:
        return Alt(tuple(draw(rng, depth + 1, repeat) for _ in range(rng.randint(2, 3))))
    if depth < 3 and roll < 0.6:
        return Seq(tuple(draw(rng, depth + 1, repeat) for _ in range(rng.randint(2, 3))))
    if depth < 3 and roll < 0.72:
        inner = draw(rng, depth + 1, repeat)
        # llguidance meets its limits ("Too many items") repeating what matches nothing: not drawn.
        return Rep(inner, rng.choice("?*+" if repeat and not is_empty(inner) else "?"))
    if roll < 0.85:
        return Dead()
    return Lit(rng.choice(CHARS))


def is_empty(node) -> bool:
    """The oracle: whether the tree's language is empty."""
    if isinstance(node, Lit):
        return False
    if isinstance(node, Dead):
        return True
    if isinstance(node, Seq):
        return any(is_empty(part) for part in node.parts)
    if isinstance(node, Alt):
        return all(is_empty(option) for option in node.options)
    return node.kind == "+" and is_empty(node.inner)


def shortest(node) -> str:
    """A shortest member of a non-empty tree's language."""
    if isinstance(node, Lit):
        return node.char
    if isinstance(node, Seq):
        return "".join(shortest(part) for part in node.parts)
    if isinstance(node, Alt):
        return min((shortest(o) for o in node.options if not is_empty(o)), key=lambda text: (len(text), text))
    return shortest(node.inner) if node.kind == "+" else ""


def stuck_prefixes(node) -> set[str] | None:
    """Every output the search can start in a repetition-free tree: the prefixes of its members and
    of the strings after which it needs the empty class (None when it repeats)."""
    def walk_tree(node) -> tuple[set[str], set[str]]:  # (members, strings stuck before the empty class)
        if isinstance(node, Lit):
            return {node.char}, set()
        if isinstance(node, Dead):
            return set(), {""}
        if isinstance(node, Alt):
            members, stuck = set(), set()
            for option in node.options:
                option_members, option_stuck = walk_tree(option)
                members |= option_members
                stuck |= option_stuck
            return members, stuck
        if isinstance(node, Seq):
            members, stuck = {""}, set()
            for part in node.parts:
                part_members, part_stuck = walk_tree(part)
                stuck |= {m + s for m in members for s in part_stuck}
                members = {m + p for m in members for p in part_members}
            return members, stuck
        if node.kind != "?":
            raise ValueError("repeats")
        inner_members, inner_stuck = walk_tree(node.inner)
        return inner_members | {""}, inner_stuck
    try:
        members, stuck = walk_tree(node)
    except ValueError:
        return None
    return {text[:cut] for text in members | stuck for cut in range(len(text) + 1)}


def as_regex(node) -> str:
    if isinstance(node, Lit):
        return node.char
    if isinstance(node, Dead):
        return DEAD_CLASS
    if isinstance(node, Seq):
        return "".join(as_regex(part) for part in node.parts)
    if isinstance(node, Alt):
        return "(?:" + "|".join(as_regex(option) for option in node.options) + ")"
    return "(?:" + as_regex(node.inner) + ")" + node.kind


class LarkWriter:
    """Writes a tree as a Lark grammar (some alternations as rules of their own) and as the
    character-level `Cfg` of `support.format_fuzz` (the Earley recognizer's input)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.rules: list[str] = []
        self.cfg = Cfg()

    def write(self, node) -> str:
        self.cfg.rules["start"] = []
        text, symbol = self.item(node)
        self.cfg.rules["start"] = [(symbol,)]
        return "\n".join([f"start: {text}", *self.rules]) + "\n"

    def item(self, node) -> tuple[str, object]:
        if isinstance(node, Lit):
            return json.dumps(node.char), frozenset(node.char)
        if isinstance(node, Dead):
            return f"/{DEAD_CLASS}/", frozenset()
        name = self.cfg.fresh("r")
        if isinstance(node, Seq):
            parts = [self.item(part) for part in node.parts]
            self.cfg.rules[name] = [tuple(symbol for _, symbol in parts)]
            return "(" + " ".join(text for text, _ in parts) + ")", name
        if isinstance(node, Alt):
            options = [self.item(option) for option in node.options]
            self.cfg.rules[name] = [(symbol,) for _, symbol in options]
            body = " | ".join(text for text, _ in options)
            if self.rng.random() < 0.5:  # a rule of its own
                self.rules.append(f"{name}: {body}")
                return name, name
            return f"({body})", name
        text, symbol = self.item(node.inner)
        self.cfg.rules[name] = {"?": [(), (symbol,)], "*": [(), (name, symbol)], "+": [(symbol,), (name, symbol)]}[
            node.kind]
        return f"({text}){node.kind}", name


# -- the compilers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["deepseek", "llama-2"])
def compiler(request) -> GrammarCompiler:
    if request.param == "deepseek":
        tokenizer = request.getfixturevalue("deepseek_tokenizer")
        return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[1])
    tokenizer = sentencepiece_like(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)]))
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[2])


def verdict(compiler: GrammarCompiler, request: GrammarRequest) -> str:
    """"" when the check passes the grammar, else its error."""
    try:
        compiler.check(request)
    except GrammarError as error:
        return str(error)
    return ""


def repeats(node) -> bool:
    """Whether the tree holds a ``*`` or ``+``."""
    if isinstance(node, (Seq, Alt)):
        return any(repeats(child) for child in (node.parts if isinstance(node, Seq) else node.options))
    return isinstance(node, Rep) and (node.kind != "?" or repeats(node.inner))


LIMITS = "exceeds llguidance's limits"
DEAD_END = "reaches a dead end"


def test_dead_branches_never_refuse_a_satisfiable_grammar_and_empty_ones_are_dead_ends(compiler):
    rng = random.Random(31)
    counts = {"live": 0, "refused": 0, "unseen": 0}
    for index in range(40 * SEEDS):
        tree = draw(rng, repeat=index % 2 == 0)
        writer = LarkWriter(rng)
        requests = [GrammarRequest(GrammarKind.REGEX, as_regex(tree)), GrammarRequest(GrammarKind.LARK, writer.write(tree))]
        if not is_empty(tree):
            witness = shortest(tree)
            assert regex.fullmatch(as_regex(tree), witness) and writer.cfg.accepts(witness), (tree, witness)
            for request in requests:
                error = verdict(compiler, request)
                assert error == "", (request, witness, error)
            counts["live"] += 1
            continue
        assert not any(writer.cfg.accepts(text) for text in ["", *CHARS])  # the recognizer agrees, briefly
        prefixes = stuck_prefixes(tree)
        for request in requests:
            error = verdict(compiler, request)
            assert error == "" or DEAD_END in error or (LIMITS in error and repeats(tree)), (request, error)
            # Seen: no output reaches the walk's depth without a dead end, and the search's masks
            # cover every output it can start (at most 1 + 6 + 36 here).
            if prefixes is not None and max(map(len, prefixes)) < PROBE_TOKENS:
                assert DEAD_END in error, (request, sorted(prefixes))
                counts["refused"] += 1
            else:
                counts["unseen"] += 1
    assert counts["live"] >= 10 * SEEDS and counts["refused"] >= 5 * SEEDS, counts


DEAD_FIRST = {
    "lark": GrammarRequest(GrammarKind.LARK, 'start: "a" /[^\\s\\S]/ | "b"'),
    "lark, dead branch second": GrammarRequest(GrammarKind.LARK, 'start: "b" | "a" /[^\\s\\S]/'),
    "lark, dead rule deep": GrammarRequest(GrammarKind.LARK, 'start: dead | "zz"\ndead: "a" ("b" | "c") /[^\\s\\S]/'),
    "lark, dead past the walk": GrammarRequest(GrammarKind.LARK, 'start: "aaaa" /[^\\s\\S]/ | "b"'),
    "regex": GrammarRequest(GrammarKind.REGEX, "a[^\\s\\S]|b"),
}


@pytest.mark.parametrize("name", list(DEAD_FIRST))
def test_a_grammar_whose_first_branch_dead_ends_is_accepted(compiler, name):
    assert verdict(compiler, DEAD_FIRST[name]) == ""
    compiler.compile(DEAD_FIRST[name])


@pytest.mark.parametrize("grammar", ['start: "a" /[^\\s\\S]/ | "b" /[^\\s\\S]/',
                                     'start: ("ab" | "cd") /[^\\s\\S]/', 'start: x\nx: ("a" | "b")? /[^\\s\\S]/'])
def test_a_grammar_whose_every_branch_dead_ends_is_refused(compiler, grammar):
    assert "reaches a dead end" in verdict(compiler, GrammarRequest(GrammarKind.LARK, grammar))


class CountingMatcher:
    """An llguidance matcher that counts the masks it and its copies compute (a test double)."""

    def __init__(self, matcher, counter: list[int]):
        self._matcher, self._counter = matcher, counter

    def deep_copy(self):
        return CountingMatcher(self._matcher.deep_copy(), self._counter)

    def unsafe_compute_mask_ptr(self, pointer, size):
        self._counter[0] += 1
        return self._matcher.unsafe_compute_mask_ptr(pointer, size)

    def __getattr__(self, name):
        return getattr(self._matcher, name)


def walked(compiler: GrammarCompiler, lark: str, budget: SearchBudget) -> tuple[str, int]:
    """(the search's error, masks it computed) for a Lark answer grammar, from the answer's start."""
    matcher = compiler.compile_source(compiler.document_text(
        PROBE_LARK.format(token_id=compiler._probe_token_id), GrammarRequest(GrammarKind.LARK, lark)))
    matcher.bitmask()
    assert matcher.consume_token(compiler._probe_token_id)
    counter = [0]
    vocabulary = BranchVocabulary.of(compiler._tokenizer, compiler._tokenizer.vocab_size)
    result = walk(CountingMatcher(matcher._matcher, counter), compiler.mask_words, compiler._eos_ids,
                  lambda: vocabulary, walk_masks=PROBE_TOKENS, budget=budget, by_bytes=True)
    return result.error, counter[0]


# The walk dead-ends at once ("a"); the search then meets thousands of outputs that dead-end later.
DEEP_DEAD = 'start: "a" /[^\\s\\S]/ | /[b-z][a-z]{0,7}/ /[^\\s\\S]/'


@pytest.mark.parametrize("lark, error", [
    (DEEP_DEAD + ' | "~"', ""),  # satisfiable, its live output past the budget: passed
    (DEEP_DEAD, ""),  # unsatisfiable, but not within the budget: passed
    ('start: ("a" | "b") /[^\\s\\S]/', "NoExtension"),  # unsatisfiable within it
])
def test_the_search_computes_at_most_its_walk_and_its_budget(compiler, lark, error):
    budget = SearchBudget(12)
    found, masks = walked(compiler, lark, budget)
    assert found.startswith(error) and bool(found) == bool(error)
    assert masks <= PROBE_TOKENS + 12 and masks == PROBE_TOKENS + 12 - budget.masks


class RefusalCounter(CountingMatcher):
    """`CountingMatcher` that counts the tokens it and its copies refuse instead of the masks."""

    def deep_copy(self):
        return RefusalCounter(self._matcher.deep_copy(), self._counter)

    def unsafe_compute_mask_ptr(self, pointer, size):
        return self._matcher.unsafe_compute_mask_ptr(pointer, size)

    def consume_token(self, token_id: int) -> bool:
        accepted = self._matcher.consume_token(token_id)
        self._counter[0] += not accepted or self._matcher.is_error()
        return accepted


# The walk dead-ends at once ("a"); every other first token ([b-z] and the tokens that start with
# one) then meets llguidance's lexer limit (a{100000}) when consumed, which takes no mask.
LIMITED_PAST_THE_WALK = 'start: "a" /[^\\s\\S]/ | /[b-z]+/ /a{100000}/'


@pytest.mark.parametrize("by_bytes", [True, False])
def test_tokens_refused_past_the_walk_are_spent_from_the_budget(compiler, by_bytes):
    """A token the matcher refuses (a limit, an unknown-word token) costs a rebuilt matcher, as a
    mask does. They took nothing from the budget: a grammar like this one tried every allowed token
    of every state the search reached, 20k of them at one state of DeepSeek's vocabulary when the
    grammar counts tokens (a minute of preparation CPU for one check with the whole budget)."""
    matcher = compiler.compile_source(compiler.document_text(
        PROBE_LARK.format(token_id=compiler._probe_token_id), GrammarRequest(GrammarKind.LARK, LIMITED_PAST_THE_WALK)))
    matcher.bitmask()
    assert matcher.consume_token(compiler._probe_token_id)
    refused, budget = [0], SearchBudget(12)
    vocabulary = BranchVocabulary.of(compiler._tokenizer, compiler._tokenizer.vocab_size)
    result = walk(RefusalCounter(matcher._matcher, refused), compiler.mask_words, compiler._eos_ids,
                  lambda: vocabulary, walk_masks=PROBE_TOKENS, budget=budget, by_bytes=by_bytes)
    assert 0 < refused[0] <= 12, refused
    assert result == ("", False) and budget.masks == 0  # inconclusive: passed


def test_one_check_shares_one_budget_between_its_grammars(compiler, monkeypatch):
    """A check of many grammars (a request's tools) gives all their searches one budget, spent once:
    the grammars past it pass unsearched; the next check has a budget of its own."""
    budgets = []

    def spy(*args, budget, **kwargs):
        budgets.append(budget)
        return walk(*args, budget=budget, **kwargs)

    monkeypatch.setattr(grammar_module, "walk", spy)
    requests = tuple(GrammarRequest(GrammarKind.LARK, DEEP_DEAD + f' | "~{i}"') for i in range(6))
    assert compiler.first_failure(requests) is None
    assert len(budgets) == 6 and all(budget is budgets[0] for budget in budgets) and budgets[0].masks == 0
    assert compiler.first_failure((GrammarRequest(GrammarKind.LARK, 'start: "a" /[^\\s\\S]/ | "bb"'),)) is None
    assert budgets[-1] is not budgets[0] and budgets[-1].masks > 0


def small_vocabulary_compiler() -> tuple[GrammarCompiler, list[str]]:
    """A Unigram vocabulary of JSON punctuation, digits, "b" and "c" (which has the lower id first):
    it cannot spell "\u00e9"."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="never")
    tokenizer.decoder = decoders.Metaspace("\u2581", prepend_scheme="never")
    tokenizer.train_from_iterator(['{"b":"c"} [0,1] "bc" "cb" 12 -3'] * 30, trainers.UnigramTrainer(
        vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False))
    compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[2])
    return compiler, sorted("bc", key=tokenizer.token_to_id)


def test_a_json_schema_whose_first_member_cannot_complete_is_accepted():
    """Over a vocabulary that cannot spell "\u00e9", the anyOf member "b\u00e9" starts (the walk takes
    '"' then 'b', the lower id of the two) and never completes; "c" does. The check refused the schema (and
    worded it as a limit); a pattern probed on its own (a branch the output need not take) refused
    it too."""
    compiler, (low, high) = small_vocabulary_compiler()
    for schema in ({"anyOf": [{"const": low + "\u00e9"}, {"const": high}]},
                   {"anyOf": [{"type": "string", "pattern": f"^{low}\u00e9$"}, {"type": "integer"}]},
                   {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": f"^{low}\u00e9$"}]}):
        request = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))
        assert verdict(compiler, request) == "", schema
        compiler.compile(request)
    alone = verdict(compiler, GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({"const": low + "\u00e9"})))
    assert "reaches a dead end" in alone and "cannot spell" in alone


def self_referencing_arrays(alternatives: int) -> GrammarRequest:
    return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({"anyOf": [
        {"type": "array", "items": {"$ref": "#"}, "maxItems": i + 1} for i in range(alternatives)] + [{"type": "integer"}]}))


def test_a_limit_met_by_a_first_token_off_the_walk_refuses_the_grammar():
    """The walk takes the lowest ids (a digit or "-", which open few parser items); "[" opens 2944
    items under 128 self-referencing array alternatives, past the 2000 a row holds. The check
    passed the schema and a sampled "[" ended the request with a 500 before any output; now it is
    refused. With 64 alternatives, "[" and four more nested ones stay within the limits."""
    compiler, _ = small_vocabulary_compiler()
    refused = verdict(compiler, self_referencing_arrays(128))
    assert "exceeds llguidance's limits" in refused and "Current row has" in refused
    matcher = compiler.compile(self_referencing_arrays(64))
    opener = next(t for t in range(compiler.mask_words * 32) if compiler.token_bytes(t) == b"[")
    for _ in range(5):
        matcher.bitmask()
        assert matcher.consume_token(opener) and not matcher.is_error


def test_allowed_ids_and_branches_read_the_mask_layout():
    rng = np.random.default_rng(4)
    vocabulary = BranchVocabulary(frozenset({3}), np.array([-1, 97, 97, 98, -1, 97, 99, 98], dtype=np.int16),
                                  np.array([1 if b == 97 else 3 if b == 98 else -1 for b in range(256)]))
    for vocab_size in (1, 31, 32, 33, 100):
        words = -(-vocab_size // 32)
        mask = rng.integers(-2**31, 2**31, size=words, dtype=np.int64).astype(np.int32)
        mask[rng.random(words) < 0.3] = 0
        expected = [i for i in range(vocab_size) if (int(mask[i // 32]) >> (i % 32)) & 1]
        assert allowed_ids(mask, vocab_size).tolist() == expected
    mask = np.array([0b11101110], dtype=np.int32)  # ids 1, 2, 3, 5, 6, 7
    # "a" (1) covers 2 and 5, which start with its byte; 3 is EOS; "b" (3) is not allowed, so 7 stays
    assert branch_ids(mask, vocabulary, by_bytes=True) == [1, 6, 7]
    assert branch_ids(mask, vocabulary, by_bytes=False) == [1, 2, 5, 6, 7]

"""Regex, choice and Lark-grammar response formats against independent matchers.

Random formats (`support.format_fuzz`) go through chat preparation as a ``response_format`` does
(`FrontendModel.prepare_chat`: the request's grammar compiled for the model) on two tokenizers: the
DeepSeek byte-level BPE and a SentencePiece-style one (``▁`` words, byte-fallback tokens). A random
model writes outputs under the masks: random logits each step, sampled at several temperatures
or greedy, leaning on EOS where the grammar allows it. Each output is fed through the request's own
output path, and the content it returns must be matched by the independent judge: the `regex`
package's ``fullmatch`` for regexes, membership for choices, an Earley recognizer over the generated
grammar. An output cut by its token limit (finish ``length``) must be a prefix the judge can still
complete (``partial`` matching for regexes).

The other direction (the mask does not over-restrict): where the language is small it is
enumerated, and each member, written in a random tokenization of its bytes, is accepted and then
ends with EOS; strings near them that the judge refuses are refused. Over HTTP (the tiny served
core at temperature 1 and greedy), a complete answer matches and ends with ``stop``, an output
cut by ``max_tokens`` ends with ``length``, and invalid formats are a 400 with a specific message.

``HELIOS_FORMAT_FUZZ_SEEDS`` (default 1) multiplies the number of random formats per test.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import random
from dataclasses import dataclass

import numpy as np
import pytest
import regex

from helios.frontend.session import FrontendModel
from helios.frontend.structured.grammar import GrammarError
from helios.runtime.records.events import FinishReason
from helios.server.schemas import ChatCompletionRequest
from support.format_fuzz import language, mutations, random_choices, random_grammar, random_regex

from .served import deepseek_model, run_output, served_contract
from .test_echo_offsets import NONE_FRONTEND
from .test_logprob_offsets_spm import DECODERS, sentencepiece_like

SEEDS = int(os.environ.get("HELIOS_FORMAT_FUZZ_SEEDS", "1"))
TEMPERATURES = (0.0, 0.7, 1.5)
MAX_TOKENS = 24
SPM_EOS = 2


@dataclass(frozen=True)
class Case:
    """A chat frontend and what the tests need of its vocabulary (read-only)."""

    model: FrontendModel
    eos: int
    vocab_size: int
    token_bytes: tuple[bytes | None, ...]  # as the grammar spells each token; None: special
    by_bytes: dict[bytes, tuple[int, ...]]  # the plain tokens spelling each byte string
    longest: int

    @classmethod
    def of(cls, model: FrontendModel, eos: int, vocab_size: int) -> Case:
        compiler = model._grammar  # the model's own grammar compiler
        spelled = tuple(None if compiler.is_special_token(i) else compiler.token_bytes(i) for i in range(vocab_size))
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(spelled):
            if data:
                by_bytes.setdefault(data, []).append(token_id)
        return cls(model, eos, vocab_size, spelled, {k: tuple(v) for k, v in by_bytes.items()},
                   max(len(k) for k in by_bytes))

    def prepare(self, response_format: dict):
        body = {"model": self.model.served_id, "messages": [{"role": "user", "content": "go"}],
                "response_format": response_format}
        return self.model.prepare_chat(ChatCompletionRequest.model_validate(body))

    def tokenize(self, data: bytes, rng: random.Random) -> list[int]:
        """A random tokenization of `data` (any split into vocabulary tokens, not the canonical one)."""
        reachable = [False] * (len(data) + 1)  # reachable[i]: data[i:] splits into tokens
        reachable[len(data)] = True
        for start in range(len(data) - 1, -1, -1):
            reachable[start] = any(data[start:start + size] in self.by_bytes and reachable[start + size]
                                   for size in range(1, min(self.longest, len(data) - start) + 1))
        assert reachable[0], f"{data!r} has no tokenization"
        ids, start = [], 0
        while start < len(data):
            sizes = [size for size in range(1, min(self.longest, len(data) - start) + 1)
                     if data[start:start + size] in self.by_bytes and reachable[start + size]]
            size = max(sizes) if rng.random() < 0.5 else rng.choice(sizes)
            ids.append(rng.choice(self.by_bytes[data[start:start + size]]))
            start += size
        return ids

    def text(self, ids: list[int]) -> str:
        """The text the grammar saw, up to the last complete character."""
        return codecs.getincrementaldecoder("utf-8")().decode(b"".join(self.token_bytes[i] for i in ids))


def sentencepiece_case(decoder: str) -> Case:
    tokenizer = sentencepiece_like(DECODERS[decoder])
    contract = served_contract(tokenizer.get_vocab_size(), NONE_FRONTEND, [SPM_EOS])
    model = FrontendModel.from_contract(contract, tokenizer, "{% for m in messages %}{{ m.content }}{% endfor %}")
    return Case.of(model, SPM_EOS, tokenizer.get_vocab_size())


@pytest.fixture(scope="module", params=["deepseek", *DECODERS])
def case(request) -> Case:
    """The DeepSeek byte-level BPE, or a SentencePiece-style tokenizer with Llama-2's decoder
    sequence or the Metaspace decoder."""
    if request.param == "deepseek":
        tokenizer = request.getfixturevalue("deepseek_tokenizer")
        return Case.of(deepseek_model(tokenizer), 1, tokenizer.get_vocab_size())
    return sentencepiece_case(request.param)


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab_size])


class GrammarLimit(Exception):
    """The matcher met one of llguidance's limits mid-output (the runtime ends such a request as an
    error, never as a stop: `helios.runtime.feedback.GrammarFailure`)."""


def sample(matcher, case: Case, rng: np.random.Generator, temperature: float,
           max_tokens: int = MAX_TOKENS) -> tuple[list[int], bool]:
    """A random model's output under the masks: (ids without EOS, whether EOS ended it). Each step
    draws random logits over the allowed tokens (EOS raised by 3 where allowed) and samples them at
    `temperature` (0: greedy). GrammarLimit when the matcher enters its error state."""
    ids: list[int] = []
    while len(ids) < max_tokens:
        mask = matcher.bitmask()
        if matcher.is_error:  # its mask allows only EOS now, which must not read as a complete answer
            raise GrammarLimit(matcher.error)
        allowed = allowed_ids(mask, case.vocab_size)
        assert allowed.size, f"a mask that allows nothing after {case.text(ids)!r}"
        logits = rng.standard_normal(allowed.size) * 2 + np.where(allowed == case.eos, 3.0, 0.0)
        if temperature == 0:
            token_id = int(allowed[np.argmax(logits)])
        else:
            weights = np.exp((logits - logits.max()) / temperature)
            token_id = int(rng.choice(allowed, p=weights / weights.sum()))
        assert matcher.consume_token(token_id), matcher.error
        if token_id == case.eos:
            return ids, True
        ids.append(token_id)
    return ids, False


def content(prepared, ids: list[int], ended: bool) -> str:
    """What the request's output path returns for these tokens."""
    _, final = run_output(prepared, ids + [prepared.output.eos_token_ids[0]] if ended else ids,
                          FinishReason.EOS if ended else FinishReason.LENGTH)
    assert final.result.errors == (), final.result
    return final.result.content


def outputs(prepared, case: Case, rng: np.random.Generator, count: int, limits: list | None = None):
    """(text the grammar saw, content returned, ended) for `count` outputs over the temperatures;
    an output that meets llguidance's limits is appended to `limits` (GrammarLimit if None)."""
    for index in range(count):
        try:
            ids, ended = sample(prepared.grammar.fork(), case, rng, TEMPERATURES[index % len(TEMPERATURES)])
        except GrammarLimit as error:
            if limits is None:
                raise
            limits.append(str(error))
            continue
        yield case.text(ids), content(prepared, ids, ended), ended


def forced(prepared, case: Case, text: str, rng: random.Random) -> bool:
    """Whether the grammar takes `text` (a random tokenization of it) and then EOS."""
    probe = prepared.grammar.fork()
    return all(probe.consume_token(t) for t in case.tokenize(text.encode(), rng) + [case.eos])


def matches(pattern: str, text: str, partial: bool = False) -> bool:
    """The judge: `regex`'s fullmatch (``partial``: `text` can still be completed to a match); a
    backtracking blow-up fails the test instead of hanging it."""
    return bool(regex.fullmatch(pattern, text, partial=partial, timeout=10))


# -- regexes ------------------------------------------------------------------------------------------


def test_sampled_and_greedy_outputs_match_the_regex(case):
    rng, np_rng = random.Random(11), np.random.default_rng(11)
    ended = 0
    for _ in range(12 * SEEDS):
        pattern = random_regex(rng).pattern
        prepared = case.prepare({"type": "regex", "regex": pattern})
        for seen, returned, done in outputs(prepared, case, np_rng, 6):
            if done:
                assert returned == seen and matches(pattern, returned), (pattern, seen, returned)
                ended += 1
            else:  # finish "length": the text so far can still be completed
                assert matches(pattern, seen, partial=True), (pattern, seen)
    assert ended >= 12 * SEEDS * 2


def test_every_member_of_a_small_regex_language_is_reachable_and_nothing_else(case):
    rng, np_rng = random.Random(12), np.random.default_rng(12)
    judged = 0
    while judged < 10 * SEEDS:
        tree = random_regex(rng, finite=True)
        members = language(tree)
        if not members:
            continue
        pattern = tree.pattern
        assert all(matches(pattern, member) for member in members), pattern  # the enumeration is right
        prepared = case.prepare({"type": "regex", "regex": pattern})
        for member in sorted(members):
            assert forced(prepared, case, member, rng), (pattern, member)
        for member in rng.sample(sorted(members), min(4, len(members))):
            for near in mutations(rng, member, 4):
                if near not in members:
                    assert not forced(prepared, case, near, rng), (pattern, near)
        for seen, _, done in outputs(prepared, case, np_rng, 4):
            assert seen in members if done else any(m.startswith(seen) for m in members), (pattern, seen)
        judged += 1


# llguidance reads \d, \w and \s with Unicode semantics: \d any decimal digit (Nd), \s Unicode
# White_Space, \w letters, marks, decimal digits, connector punctuation and joiners (UTS #18, as
# the `regex` package does; Python's `re` differs for \w and \s, noted on the right).
UNICODE_CLASSES = [
    (r"\d", "٣", True), (r"\d", "５", True), (r"\d", "²", False),  # re: same
    (r"\w", "é", True), (r"\w", "ж", True), (r"\w", "中", True), (r"\w", "_", True),
    (r"\w", "\u0301", True), (r"\w", "²", False),  # re: a combining mark is not \w, ² is
    (r"\s", "\u00a0", True), (r"\s", "\u2003", True), (r"\s", "\x1c", False),  # re: \x1c is \s
    (r".", "\n", False), (r"[^a]", "\n", True),
]


@pytest.mark.parametrize("pattern, text, expected", UNICODE_CLASSES)
def test_class_escapes_are_unicode(case, pattern, text, expected):
    prepared = case.prepare({"type": "regex", "regex": pattern})
    assert forced(prepared, case, text, random.Random(1)) is expected
    assert matches(pattern, text) is expected


@pytest.mark.parametrize("decoder", list(DECODERS))
def test_a_constrained_answer_keeps_the_leading_space_its_grammar_matched(decoder):
    """SentencePiece decoders strip the leading space of a sequence's first ``▁`` word; a chat
    output was decoded as such a sequence, so the choice " yes", written as the token ``▁yes``,
    was answered "yes" (and the regex " \\d" answered "3"), which the format does not match."""
    case = sentencepiece_case(decoder)
    ids = case.model._tokenizer.encode("yes", add_special_tokens=False).ids
    assert case.text(ids) == " yes"  # one ▁ word, as the grammar spells it
    for response_format in ({"type": "choice", "choices": [" yes", " no"]}, {"type": "regex", "regex": " \\w+"}):
        prepared = case.prepare(response_format)
        probe = prepared.grammar.fork()
        assert all(probe.consume_token(t) for t in ids + [SPM_EOS])
        assert content(prepared, ids, True) == " yes"
    unconstrained = case.prepare({"type": "text"})  # a free answer still reads as the sequence it starts
    assert content(unconstrained, ids, True) == "yes"


@pytest.mark.parametrize("decoder", list(DECODERS))
def test_sentencepiece_words_read_as_the_text_shows_them(decoder):
    """With the Metaspace decoder, llguidance spelled ``▁the`` with a literal U+2581: a regex that
    allows no space let the answer " the" through, and one that asks for a space refused ``▁`` words."""
    case = sentencepiece_case(decoder)
    tokenizer = case.model._tokenizer
    assert case.token_bytes[tokenizer.token_to_id("▁the")] == b" the"
    the = [tokenizer.token_to_id("▁the")]
    assert not forced_ids(case.prepare({"type": "regex", "regex": "\\S+"}), the + [SPM_EOS])
    assert forced_ids(case.prepare({"type": "regex", "regex": " the"}), the + [SPM_EOS])


def forced_ids(prepared, ids: list[int]) -> bool:
    probe = prepared.grammar.fork()
    return all(probe.consume_token(t) for t in ids)


# -- choices ------------------------------------------------------------------------------------------


def test_outputs_are_exactly_one_choice_and_every_choice_is_reachable(case):
    rng, np_rng = random.Random(13), np.random.default_rng(13)
    for index in range(10 * SEEDS):
        choices = random_choices(rng) if index else [f"c{i}é" for i in range(256)]
        prepared = case.prepare({"type": "choice", "choices": choices})
        unique = set(choices)
        for choice in unique if len(unique) <= 16 else rng.sample(sorted(unique), 16):
            assert forced(prepared, case, choice, rng), (choices, choice)  # a prefix of another too
        for choice in rng.sample(sorted(unique), min(3, len(unique))):
            for near in [choice[:-1], choice + "x", choice + " ", *mutations(rng, choice, 3)]:
                if near and near not in unique:
                    assert not forced(prepared, case, near, rng), (choices, near)
        for seen, returned, done in outputs(prepared, case, np_rng, 4):
            if done:
                assert returned == seen and seen in unique, (choices, seen)
            else:
                assert any(choice.startswith(seen) for choice in unique), (choices, seen)


# -- grammars -----------------------------------------------------------------------------------------


def test_grammar_outputs_are_derivable_and_short_derivations_are_reachable(case):
    rng, np_rng = random.Random(14), np.random.default_rng(14)
    judged, refused, limits = 0, [], []
    for _ in range(10 * SEEDS):
        grammar = random_grammar(rng)
        try:
            prepared = case.prepare({"type": "grammar", "grammar": grammar.lark})
        except GrammarError as error:  # a very ambiguous grammar over short lexemes: llguidance's Earley items
            assert "exceeds llguidance's limits: parser error: Too many items" in str(error), (grammar.lark, error)
            refused.append(grammar.lark)
            continue
        for seen, returned, done in outputs(prepared, case, np_rng, 4, limits):
            if done:
                assert returned == seen and grammar.cfg.accepts(seen), (grammar.lark, seen)
        short = grammar.cfg.language(6, cap=80) or grammar.cfg.language(3, cap=200) or ()
        judged += len(short)
        for word in sorted(short):
            assert forced(prepared, case, word, rng), (grammar.lark, word)
            for near in mutations(rng, word, 2):
                if not grammar.cfg.accepts(near):
                    assert not forced(prepared, case, near, rng), (grammar.lark, near)
    assert judged >= 50 * SEEDS and len(refused) <= SEEDS, refused
    # Mid-output limits (Earley items of very ambiguous grammars over runs of spaces) end as errors.
    assert all("Too many items" in error for error in limits) and len(limits) <= SEEDS, limits


def test_the_recognizer_agrees_with_hand_written_grammars():
    """The judge itself: left recursion, nullable rules and repetition."""
    from support.format_fuzz import Cfg

    a, b = frozenset("a"), frozenset("b")
    cfg = Cfg({"start": [("start", a), ("opt",)], "opt": [(), (b,)]})  # b? a*
    assert all(cfg.accepts(text) for text in ("", "b", "aaa", "baa"))
    assert not any(cfg.accepts(text) for text in ("ab", "bb", "c"))
    assert cfg.language(2) == frozenset({"", "b", "a", "aa", "ba"})


# -- over HTTP: finish reasons and refusals -----------------------------------------------------------


@pytest.fixture(scope="module")
def served_app(tmp_path_factory):
    from helios.server.app import create_app
    from support.server_core import served_tiny_core

    with served_tiny_core(tmp_path_factory.getbasetemp(), frontend_workers=2) as served:
        yield create_app(served)


def post_chat(app, body: dict) -> tuple[int, dict]:
    import httpx

    from support.server_core import SERVED_ID

    payload = json.dumps({"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}],
                          "chat_template_kwargs": {"enable_thinking": False}, **body})  # ASCII: lone surrogates escaped

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            return await client.post("/v1/chat/completions", content=payload.encode(),
                                     headers={"content-type": "application/json"})

    response = asyncio.run(scenario())
    return response.status_code, response.json()


def test_served_answers_match_and_end_with_stop_or_length(served_app):
    rng = random.Random(15)
    finished = {"stop": 0, "length": 0}
    for index in range(4 * SEEDS):
        pattern = random_regex(rng).pattern
        for seed, temperature in ((1, 1.0), (2, 1.0), (3, 0.0)):
            status, body = post_chat(served_app, {"response_format": {"type": "regex", "regex": pattern},
                                                  "seed": seed, "temperature": temperature, "max_tokens": 12})
            assert status == 200, body
            (choice,) = body["choices"]
            text = choice["message"]["content"]
            if choice["finish_reason"] == "stop":
                assert matches(pattern, text), (pattern, text)
            else:
                assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 12, body
                assert matches(pattern, text, partial=True), (pattern, text)
            finished[choice["finish_reason"]] += 1
    assert finished["stop"] and finished["length"], finished


@pytest.mark.parametrize("response_format, max_tokens, finish", [
    ({"type": "regex", "regex": "[a-z]{40}"}, 3, "length"),
    ({"type": "regex", "regex": "(?:yes|no)"}, 16, "stop"),
    ({"type": "choice", "choices": ["ok", "ok then", "oh"]}, 16, "stop"),
    ({"type": "grammar", "grammar": 'start: "x" mid "y"\nmid: "-" mid | "="\n'}, 2, "length"),
    ({"type": "grammar", "grammar": 'start: "x" mid "y"\nmid: "-" | "="\n'}, 16, "stop"),
])
def test_served_finish_reasons(served_app, response_format, max_tokens, finish):
    for temperature in (0.0, 1.0):
        status, body = post_chat(served_app, {"response_format": response_format, "seed": 4,
                                              "temperature": temperature, "max_tokens": max_tokens})
        assert status == 200, body
        (choice,) = body["choices"]
        assert choice["finish_reason"] == finish, body
        if finish == "stop" and response_format["type"] == "choice":
            assert choice["message"]["content"] in response_format["choices"]


INVALID_FORMATS = {  # response_format -> words the 400's message holds
    "regex syntax": ({"type": "regex", "regex": "(ab"}, "regex parse error"),
    "repetition range": ({"type": "regex", "regex": "a{2,1}"}, "invalid repetition count range"),
    "lookahead": ({"type": "regex", "regex": "a(?=b)b"}, "look-around"),
    "lookbehind": ({"type": "regex", "regex": "(?<=a)b"}, "look-around"),
    "backreference": ({"type": "regex", "regex": "(a)\\1"}, "backreferences are not supported"),
    "word boundary": ({"type": "regex", "regex": "\\bab"}, "lookarounds not supported"),
    "anchor inside": ({"type": "regex", "regex": "a^b"}, "lookarounds not supported"),
    "unknown escape": ({"type": "regex", "regex": "\\e"}, "unrecognized escape sequence"),
    "unknown property": ({"type": "regex", "regex": "\\p{NoSuchScript}"}, "regex parse error"),
    "empty class": ({"type": "regex", "regex": "[^\\s\\S]"}, "reaches a dead end"),
    "empty class later": ({"type": "regex", "regex": "ab[^\\s\\S]"}, "reaches a dead end"),
    "huge repetition": ({"type": "regex", "regex": "a{100000}"}, "exceeds llguidance's limits"),
    "nested repetition": ({"type": "regex", "regex": "(?:(?:a{100}){100}){100}"}, "exceeds llguidance's limits"),
    "lone surrogate": ({"type": "regex", "regex": "a\ud800"}, "lone surrogate"),
    "lone surrogate choice": ({"type": "choice", "choices": ["\udc00x"]}, "lone surrogate"),
    "regex too long": ({"type": "regex", "regex": "a" * 4097}, "at most 4096 characters"),
    "empty regex": ({"type": "regex", "regex": ""}, "at least 1 character"),
    "undefined rule": ({"type": "grammar", "grammar": "start: undefined_rule\n"}, "undefined_rule"),
    "grammar syntax": ({"type": "grammar", "grammar": "start: (\n"}, "invalid lark grammar"),
    "rule that never ends": ({"type": "grammar", "grammar": "start: a\na: a\n"}, "reaches a dead end"),
    "grammar regex": ({"type": "grammar", "grammar": "start: /(/\n"}, "regex parse error"),
    "too many choices": ({"type": "choice", "choices": [str(i) for i in range(257)]}, "at most 256 items"),
    "long choice": ({"type": "choice", "choices": ["a" * 4097]}, "at most 4096 characters"),
    "empty choice": ({"type": "choice", "choices": ["a", ""]}, "at least 1 character"),
    "no choices": ({"type": "choice", "choices": []}, "at least 1 item"),
    "choice not a string": ({"type": "choice", "choices": ["a", 1]}, "valid string"),
}


@pytest.mark.parametrize("name", list(INVALID_FORMATS))
def test_invalid_formats_are_a_400_with_a_specific_message(served_app, name):
    response_format, words = INVALID_FORMATS[name]
    status, body = post_chat(served_app, {"response_format": response_format, "max_tokens": 4})
    assert status == 400, body
    error = body["error"]
    assert error["type"] == "invalid_request_error", error
    assert (error["param"] or "response_format").startswith("response_format"), error  # the body's text: no param
    assert words in error["message"], error["message"]

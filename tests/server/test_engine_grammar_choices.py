"""A response's ``n`` choices reach the engine process as ``n`` admissions of one grammar source
(`helios.server.engine_grammars`): the first compiles it and the others take forks of that compile,
each advancing on its own and meeting only its own llguidance limits (`GrammarMatcher` rebuilds a
fork whose shared lexer met a limit). Before, every choice compiled the source again (a 64 KiB schema
each time)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helios.frontend.structured.grammar import GrammarCompiler, GrammarKind, GrammarRequest
from helios.server.engine_grammars import FORKS_PER_COMPILE, EngineGrammars
from server.test_grammar_limit_http import MASK_LIMIT
from support.chat_checkpoint import train_tokenizer

LIMIT = "lexer error: too many expressions constructed"
OWN_LETTERS = 12  # the letters `MASK_LIMIT` takes before its own mask meets the limit


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def serving(tokenizer) -> GrammarCompiler:
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=(0,))


@pytest.fixture
def grammars(tokenizer):
    grammars = EngineGrammars(tokenizer.to_str().encode(), tokenizer.get_vocab_size(), (0,)).start()
    yield grammars
    grammars.close()


@pytest.fixture
def compiles(monkeypatch) -> list[str]:
    """The sources the engine process's compiler builds a matcher from, in order."""
    seen: list[str] = []
    compile_source = GrammarCompiler.compile_source

    def counted(self, source: str):
        seen.append(source)
        return compile_source(self, source)

    monkeypatch.setattr(GrammarCompiler, "compile_source", counted)
    return seen


def big_schema_source(serving) -> str:
    """A 64 KiB JSON schema of required properties, inside its envelope (as the serving process sends it)."""
    properties = {f"field_{i}": {"type": ("string", "integer", "boolean")[i % 3]} for i in range(1380)}
    schema = json.dumps({"type": "object", "properties": properties, "required": list(properties)})
    assert 60_000 < len(schema) <= 64 * 1024
    return serving.grammar_text(GrammarRequest(GrammarKind.JSON_SCHEMA, schema))


def test_the_choices_of_one_source_compile_it_once(grammars, serving, compiles, tokenizer):
    source = big_schema_source(serving)
    choices = [grammars.compile(source)._matcher for _ in range(4)]
    assert compiles == [source]
    first = serving.compile_source(source).bitmask()
    opening = tokenizer.token_to_id("{")
    assert choices[0].consume_token(opening)  # each choice advances on its own
    assert np.array_equal(choices[1].bitmask(), first) and not np.array_equal(choices[0].bitmask(), first)


def test_another_source_compiles_and_one_compile_gives_at_most_a_responses_choices(grammars, serving, compiles):
    one = serving.grammar_text(GrammarRequest(GrammarKind.REGEX, "[ab]+"))
    other = serving.grammar_text(GrammarRequest(GrammarKind.REGEX, "[cd]+"))
    for _ in range(FORKS_PER_COMPILE + 1):
        grammars.compile(one)
    grammars.compile(other)
    grammars.compile(one)
    assert compiles == [one, one, other, one]


def test_each_choice_meets_its_own_limit_however_the_others_went(grammars, serving, tokenizer):
    source = serving.grammar_text(GrammarRequest(GrammarKind.LARK, MASK_LIMIT["grammar"]))
    letter = tokenizer.token_to_id("b")
    row = np.empty(serving.mask_words, dtype=np.int32)
    for _ in range(3):
        choice = grammars.compile(source)._matcher  # the one before met its limit on the shared lexer
        for taken in range(40):
            choice.fill_bitmask(row)
            if choice.is_error or not choice.consume_token(letter):
                break
        assert taken == OWN_LETTERS and choice.error.startswith(LIMIT), (taken, choice.error)

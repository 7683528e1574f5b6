"""Regexes ending in a lone backslash (an escape with nothing to escape): llguidance drops that
backslash instead of refusing the regex, so ``{"type": "regex", "regex": "a\\"}`` constrained the
answer as ``a``, a lone ``\\`` as the empty regex, and a JSON schema's ``"pattern": "^a\\"`` let
``"ab"`` through (a lone ``\\`` let any string). Each is now a 400 naming where the pattern is; an
escaped backslash at the end still compiles and means a literal backslash."""

from __future__ import annotations

import json

import pytest

from helios.frontend.structured.grammar import (GrammarCompiler, GrammarError, GrammarKind, GrammarRequest,
                                               parse_response_format)

EOS = 1


@pytest.fixture(scope="module")
def compiler(deepseek_tokenizer):
    return GrammarCompiler.from_tokenizer(deepseek_tokenizer, vocab_size=deepseek_tokenizer.get_vocab_size(),
                                          eos_token_ids=[EOS])


def accepts(compiler, tokenizer, request: GrammarRequest, text: str) -> bool:
    matcher = compiler.compile(request)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting


def schema(value: dict) -> GrammarRequest:
    return parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": value}})


@pytest.mark.parametrize("request_, where", [
    (parse_response_format({"type": "regex", "regex": "a\\"}), "the regex"),
    (parse_response_format({"type": "regex", "regex": "\\"}), "the regex"),
    (parse_response_format({"type": "regex", "regex": "a\\\\\\"}), "the regex"),
    (schema({"type": "string", "pattern": "^a\\"}), "pattern"),
    (schema({"type": "object", "properties": {"p": {"type": "string", "pattern": "\\"}}}), "pattern at /properties/p"),
    (schema({"type": "object", "patternProperties": {"^a\\": {"type": "integer"}}, "additionalProperties": False}),
     "patternProperties key"),
    (GrammarRequest(GrammarKind.LARK, 'start: %json {"type": "string", "pattern": "a\\\\"}'),
     "its %json schema: pattern"),
])
def test_a_pattern_ending_in_a_lone_backslash_is_a_400_not_a_different_regex(compiler, request_, where):
    with pytest.raises(GrammarError, match="unfinished escape") as caught:
        compiler.compile(request_)
    assert caught.value.http_status == 400
    assert where in str(caught.value)


def test_an_escaped_backslash_at_the_end_is_a_literal_backslash(compiler, deepseek_tokenizer):
    regex = parse_response_format({"type": "regex", "regex": "a\\\\"})
    assert accepts(compiler, deepseek_tokenizer, regex, "a\\")
    assert not accepts(compiler, deepseek_tokenizer, regex, "a")
    patterned = schema({"type": "string", "pattern": "^a\\\\$"})
    assert accepts(compiler, deepseek_tokenizer, patterned, json.dumps("a\\"))
    assert not accepts(compiler, deepseek_tokenizer, patterned, '"ab"')


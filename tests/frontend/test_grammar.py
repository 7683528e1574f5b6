"""Structured output with llguidance against real tokenizers: masks, envelope, errors, random sampling."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from helios.errors import RequestError
from helios.frontend.structured.grammar import (
    PATTERN_PROBES,
    GrammarCompiler,
    GrammarError,
    GrammarKind,
    GrammarRequest,
    ReasoningEnvelope,
    allocate_bitmasks,
    envelope_lark,
    parse_response_format,
    schema_patterns,
)
from helios.frontend.preparation.prompt import ReasoningState

EOS = 1  # <｜end▁of▁sentence｜>


@pytest.fixture(scope="module")
def compiler(deepseek_tokenizer):
    return GrammarCompiler.from_tokenizer(
        deepseek_tokenizer,
        vocab_size=deepseek_tokenizer.get_vocab_size(),
        eos_token_ids=[EOS],
        json_defaults={"whitespace_pattern": r"[ \n]{0,2}"},
    )


@pytest.fixture(scope="module")
def think(deepseek_tokenizer):
    return deepseek_tokenizer.token_to_id("<think>"), deepseek_tokenizer.token_to_id("</think>")


def ids_of(tokenizer, *pieces):
    """Token ids of text pieces encoded separately (so a literal tag stays plain-text tokens)."""
    return [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False).ids]


def allowed(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids whose bit is set: bit j of word w allows token 32 * w + j."""
    bits = (mask[:, None].astype(np.int64) >> np.arange(32)) & 1
    return np.flatnonzero(bits.reshape(-1)[:vocab_size])


def is_allowed(mask: np.ndarray, token_id: int) -> bool:
    return bool((int(mask[token_id // 32]) >> (token_id % 32)) & 1)


def regex(pattern):
    return GrammarRequest(GrammarKind.REGEX, pattern)


def envelope(state, think, **kwargs):
    return ReasoningEnvelope(state, "<think>", "</think>", think[0], think[1], **kwargs)


# --- request parsing and errors ---------------------------------------------------------------


def test_parse_response_format():
    assert parse_response_format(None) is None
    assert parse_response_format({"type": "text"}) is None
    assert parse_response_format({"type": "json_object"}).kind is GrammarKind.JSON_SCHEMA
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert request == GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    assert parse_response_format({"type": "regex", "regex": "a+"}) == regex("a+")
    assert parse_response_format({"type": "grammar", "grammar": "start: /a/"}).kind is GrammarKind.LARK
    assert parse_response_format({"type": "choice", "choices": ["x", "y"]}).source == '["x", "y"]'


@pytest.mark.parametrize(
    "value",
    [
        "json",
        {"type": "yaml"},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
        {"type": "regex", "regex": ""},
        {"type": "choice", "choices": []},
        {"type": "choice", "choices": ["a", 1]},
    ],
)
def test_malformed_response_format(value):
    with pytest.raises(GrammarError) as info:
        parse_response_format(value)
    assert isinstance(info.value, RequestError)


@pytest.mark.parametrize(
    "request_",
    [
        regex("(ab"),
        GrammarRequest(GrammarKind.LARK, "start: undefined_rule"),
        GrammarRequest(GrammarKind.LARK, "start: ("),
        GrammarRequest(GrammarKind.JSON_SCHEMA, '{"type": "no-such-type"}'),
        GrammarRequest(GrammarKind.JSON_SCHEMA, "not json"),
    ],
)
def test_invalid_grammars_are_request_errors_at_compile(compiler, request_):
    with pytest.raises(GrammarError) as info:
        compiler.compile(request_)
    assert info.value.http_status == 400


def many_terminals_lark(count: int = 1500) -> str:
    """A Lark grammar of `count` regex terminals in any order: it constructs, but its lexer needs
    more than llguidance's limits allow at its first mask."""
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 12))) for _ in range(count)]
    terminals = "\n".join(f"T{i}: /[a-z]{{1,{i % 20 + 1}}}[0-9]+{word}/" for i, word in enumerate(words))
    return "start: t*\nt: " + " | ".join(f"T{i}" for i in range(count)) + "\n" + terminals


LIMIT_GRAMMARS = {
    "regex": regex("a{100000}"),
    "json_schema pattern": GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(
        {"type": "string", "pattern": "^a{1000000}$"})),
    "lark terminals": GrammarRequest(GrammarKind.LARK, many_terminals_lark()),
    "optional property pattern": GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(
        {"type": "object", "properties": {"name": {"type": "string"},
                                          "code": {"type": "string", "pattern": "^a{100000}$"}}})),
}


@pytest.mark.parametrize("name", list(LIMIT_GRAMMARS))
def test_grammars_past_llguidance_lexer_limits_are_request_errors_at_compile(compiler, think, name):
    """These construct fine; their lexer limits show only at the answer's first masks or tokens (after
    a reasoning section above all), which the compiler checks, with or without an envelope."""
    request_ = LIMIT_GRAMMARS[name]
    for where in (None, envelope(ReasoningState.OPEN, think), envelope(ReasoningState.UNOPENED, think)):
        with pytest.raises(GrammarError, match="exceeds llguidance's limits: lexer error") as info:
            compiler.compile(request_, where)
        assert info.value.http_status == 400 and "<state>" not in str(info.value)
    with pytest.raises(GrammarError, match="exceeds llguidance's limits"):  # a grammar with calls references it
        compiler.compile_lark("start: @answer\n", request_)


def test_the_limit_check_passes_ordinary_grammars_and_keeps_its_verdicts(compiler, deepseek_tokenizer):
    ordinary = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(
        {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                          "n": {"type": "integer"}}, "required": ["id"]}))
    matcher = compiler.compile(ordinary)
    assert not matcher.is_error and is_allowed(matcher.bitmask(), deepseek_tokenizer.token_to_id("{"))
    compiler.compile(regex("a{1000}"))
    hits = compiler._verdict.cache_info().hits
    compiler.compile(ordinary)
    assert compiler._verdict.cache_info().hits == hits + 1  # one verdict: the schema with its pattern


def counting_probes(compiler, monkeypatch) -> list:
    """The grammars `compiler` probes from now on (llguidance matchers the check builds)."""
    probed, probe = [], compiler._probe
    monkeypatch.setattr(compiler, "_probe", lambda request: probed.append(request) or probe(request))
    return probed


def test_a_repeated_large_pattern_request_is_one_cache_hit_and_probes_a_bounded_number_of_patterns(
        compiler, monkeypatch):
    probed = counting_probes(compiler, monkeypatch)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"^cache{i}[a-z]+$"}
                                               for i in range(300)},
              "$defs": {f"d{i}": {"pattern": f"^def{i}$"} for i in range(300)}}
    request_ = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    assert len(schema_patterns(request_)) == 600
    compiler.compile(request_)
    assert len(probed) == 1 + PATTERN_PROBES and probed[0] == request_  # the grammar, then the bound
    alone = [json.loads(r.source)["pattern"] for r in probed[1:]]
    assert len(set(alone)) == PATTERN_PROBES and all(p.startswith("^cache") for p in alone)  # longest first
    info = compiler._verdict.cache_info()
    compiler.compile(request_)
    compiler.check(request_)
    assert len(probed) == 1 + PATTERN_PROBES  # nothing probed again
    after = compiler._verdict.cache_info()
    assert (after.hits, after.misses) == (info.hits + 2, info.misses)
    many = tuple(GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({"type": "string", "pattern": f"^many{i}-[a-z]+$"}))
                 for i in range(64))
    del probed[:]
    assert compiler.first_failure(many) is None and compiler.first_failure(many) is None
    assert len(probed) == 64  # each grammar once (a lone pattern's schema is its own probe); one cached verdict


def test_the_pattern_walk_probes_only_patterns_llguidance_compiles(compiler, monkeypatch):
    schema = {
        "type": "object", "pattern": "^root$", "x-ui": {"pattern": "(("}, "x-guidance": {"lenient": True},
        "not": {"pattern": "(?!x)"}, "if": {"pattern": "(?=a)"}, "propertyNames": {"pattern": "(?=b)"},
        "enum": [{"pattern": "data"}], "default": {"pattern": "data"}, "examples": [{"pattern": "data"}],
        "properties": {"a": {"type": "string", "pattern": "^a$", "x-vendor": {"pattern": "(?<=c)"}},
                       "pattern": {"type": "array", "items": {"pattern": "^item$"}, "prefixItems": [{"pattern": "^first$"}]},
                       "o": {"type": "object", "additionalProperties": {"pattern": "^extra$"},
                             "patternProperties": {"^key$": {"anyOf": [{"pattern": "^any$"}], "allOf": [{"pattern": "^all$"}],
                                                             "oneOf": [{"pattern": "^one$"}]}}}},
        "$defs": {"d": {"pattern": "^def$"}}, "definitions": {"e": {"pattern": "^definition$"}},
    }
    request_ = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    assert schema_patterns(request_) == {"^root$", "^a$", "^item$", "^first$", "^extra$", "^key$", "^any$", "^all$",
                                         "^one$", "^def$", "^definition$"}
    probed = counting_probes(compiler, monkeypatch)
    vendor = {"type": "object", "properties": {"a": {"type": "string"}}, "x-ui": {"pattern": "(("}}
    compiler.check(GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(vendor)))  # llguidance ignores it: no 400
    assert len(probed) == 1


# --- masks ------------------------------------------------------------------------------------


def test_mask_layout_and_eos(compiler, deepseek_tokenizer):
    vocab_size = deepseek_tokenizer.get_vocab_size()
    matcher = compiler.compile(regex("[ab]{2}"))
    mask = matcher.bitmask()
    assert mask.dtype == np.int32 and mask.shape == (compiler.mask_words,) == (-(-vocab_size // 32),)
    a, b, z = (deepseek_tokenizer.token_to_id(t) for t in ("a", "b", "z"))
    assert is_allowed(mask, a) and is_allowed(mask, b) and not is_allowed(mask, z) and not is_allowed(mask, EOS)
    texts = sorted(deepseek_tokenizer.decode([int(token_id)]) for token_id in allowed(mask, vocab_size))
    assert texts == ["a", "aa", "ab", "b", "ba", "bb"]
    assert matcher.consume_token(a) and matcher.consume_token(b)
    assert matcher.is_accepting and matcher.is_stopped
    assert allowed(matcher.bitmask(), vocab_size).tolist() == [EOS]
    assert matcher.consume_token(EOS) and not matcher.is_error


def test_fill_bitmask_writes_into_a_batch_row(compiler):
    rows = allocate_bitmasks(3, compiler.mask_words)
    assert (rows == -1).all()
    matcher = compiler.compile(GrammarRequest(GrammarKind.CHOICE, '["yes", "no"]'))
    matcher.fill_bitmask(rows[1])
    assert (rows[0] == -1).all() and (rows[2] == -1).all()
    assert (rows[1] == matcher.bitmask()).all() and not (rows[1] == -1).all()
    with pytest.raises(ValueError):
        matcher.fill_bitmask(np.zeros(compiler.mask_words, dtype=np.int64))
    with pytest.raises(ValueError):
        matcher.fill_bitmask(rows[:, 0])


def test_error_state_is_sticky_and_allows_only_eos(compiler, deepseek_tokenizer):
    matcher = compiler.compile(regex("ab"))
    z, a = deepseek_tokenizer.token_to_id("z"), deepseek_tokenizer.token_to_id("a")
    assert not matcher.consume_token(z)
    assert matcher.is_error and "z" in matcher.error
    assert not matcher.consume_token(a)
    assert matcher.is_error and matcher.is_stopped
    assert allowed(matcher.bitmask(), deepseek_tokenizer.get_vocab_size()).tolist() == [EOS]


def test_draft_masks_match_stepwise_masks_and_leave_state(compiler, deepseek_tokenizer):
    a, b, c, z = (deepseek_tokenizer.token_to_id(t) for t in "abcz")
    matcher = compiler.compile(regex("[a-c]{3}"))
    reference = compiler.compile(regex("[a-c]{3}"))
    expected = [reference.bitmask()]
    for token_id in (a, b):
        reference.consume_token(token_id)
        expected.append(reference.bitmask())
    out = np.zeros((4, compiler.mask_words), dtype=np.int32)
    assert matcher.fill_draft_bitmasks([a, b, z], out) == 2
    for row in range(3):
        assert (out[row] == expected[row]).all()
    assert (out[3] == out[2]).all()
    assert (matcher.bitmask() == expected[0]).all()  # unchanged
    assert matcher.consume_token(a) and matcher.consume_token(b) and matcher.consume_token(c)
    # Drafts may run through EOS once the answer is complete.
    out = np.zeros((3, compiler.mask_words), dtype=np.int32)
    assert matcher.fill_draft_bitmasks([EOS, a], out) == 1
    assert [allowed(row, deepseek_tokenizer.get_vocab_size()).tolist() for row in out] == [[EOS]] * 3


def test_fork_is_independent(compiler, deepseek_tokenizer):
    a, b = deepseek_tokenizer.token_to_id("a"), deepseek_tokenizer.token_to_id("b")
    matcher = compiler.compile(regex("[ab]{2}"))
    fork = matcher.fork()
    assert fork.consume_token(a) and fork.consume_token(b) and fork.is_stopped
    assert not matcher.is_stopped and matcher.consume_token(b)


# --- reasoning envelope -----------------------------------------------------------------------


SCHEMA_ANSWER = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({"type": "object", "properties": {"t": {"type": "string"}}}))


def test_open_envelope_reasons_freely_then_constrains_the_answer(compiler, deepseek_tokenizer, think):
    vocab_size = deepseek_tokenizer.get_vocab_size()
    matcher = compiler.compile(SCHEMA_ANSWER, envelope(ReasoningState.OPEN, think, separator="\n\n"))
    reasoning = ids_of(deepseek_tokenizer, "Plan: write </", "think> as text, then {", "\"t\": 1")
    for token_id in reasoning:
        assert matcher.consume_token(token_id), matcher.error
    mask = matcher.bitmask()
    assert is_allowed(mask, think[1]) and not is_allowed(mask, EOS) and not is_allowed(mask, think[0])
    assert matcher.consume_token(think[1])
    mask = matcher.bitmask()
    assert not is_allowed(mask, think[1]) and not is_allowed(mask, EOS)
    answer = ids_of(deepseek_tokenizer, "\n\n", '{"t": "a </', 'think> b"}')
    for token_id in answer:
        assert matcher.consume_token(token_id), matcher.error
    assert matcher.is_accepting and allowed(matcher.bitmask(), vocab_size).tolist() == [EOS]


def test_close_token_inside_the_answer_is_rejected(compiler, deepseek_tokenizer, think):
    matcher = compiler.compile(SCHEMA_ANSWER, envelope(ReasoningState.CLOSED, think))
    assert matcher.consume_token(deepseek_tokenizer.token_to_id("{"))
    assert not is_allowed(matcher.bitmask(), think[1])
    assert not matcher.consume_token(think[1]) and matcher.is_error


def test_unopened_envelope_allows_reasoning_or_a_direct_answer(compiler, deepseek_tokenizer, think):
    yes = ids_of(deepseek_tokenizer, "yes")
    choice = GrammarRequest(GrammarKind.CHOICE, '["yes", "no"]')
    direct = compiler.compile(choice, envelope(ReasoningState.UNOPENED, think))
    assert not is_allowed(direct.bitmask(), think[1])
    assert all(direct.consume_token(t) for t in yes) and direct.is_accepting
    reasoned = compiler.compile(choice, envelope(ReasoningState.UNOPENED, think))
    steps = [think[0], *ids_of(deepseek_tokenizer, "hmm"), think[1], *yes]
    assert all(reasoned.consume_token(t) for t in steps) and reasoned.is_accepting


def test_text_delimiters_when_the_tokenizer_has_no_single_token(compiler, deepseek_tokenizer):
    text_envelope = ReasoningEnvelope(ReasoningState.OPEN, "[think]", "[/think]")
    matcher = compiler.compile(regex("[0-9]+"), text_envelope)
    steps = ids_of(deepseek_tokenizer, "count [/", "think]", "42")
    assert all(matcher.consume_token(t) for t in steps), matcher.error
    assert matcher.is_accepting


def test_envelope_lark_shapes(think):
    assert envelope_lark(None) == "start: @answer\n"
    assert envelope_lark(envelope(ReasoningState.CLOSED, think, separator="\n")) == 'start: "\\n"? @answer\n'
    assert envelope_lark(envelope(ReasoningState.NO_REASONING, think)) == "start: @answer\n"
    with pytest.raises(ValueError):
        ReasoningEnvelope(ReasoningState.OPEN)
    with pytest.raises(ValueError):
        ReasoningEnvelope(ReasoningState.UNOPENED, close_text="</think>")


def test_envelope_from_contract(think):
    from helios.contract import serving_pb2 as spb

    syntax = spb.ReasoningSyntax(open="<think>", close="</think>", open_token_id=think[0], close_token_id=think[1])
    assert ReasoningEnvelope.from_contract(syntax, ReasoningState.OPEN, "\n\n") == envelope(
        ReasoningState.OPEN, think, separator="\n\n"
    )
    text_only = spb.ReasoningSyntax(open="[t]", close="[/t]")
    assert ReasoningEnvelope.from_contract(text_only, ReasoningState.OPEN) == ReasoningEnvelope(
        ReasoningState.OPEN, "[t]", "[/t]"
    )


def test_qwen_tokenizer_envelope(qwen_tokenizer):
    vocab_size = qwen_tokenizer.get_vocab_size()
    # Qwen's two EOS ids, as its served frontends declare them: the process's llguidance tokenizer
    # of that vocabulary is theirs too (conftest.shared_ll_tokenizers).
    eos = [qwen_tokenizer.token_to_id("<|im_end|>"), qwen_tokenizer.token_to_id("<|endoftext|>")]
    compiler = GrammarCompiler.from_tokenizer(qwen_tokenizer, vocab_size=vocab_size, eos_token_ids=eos)
    open_id, close_id = qwen_tokenizer.token_to_id("<think>"), qwen_tokenizer.token_to_id("</think>")
    env = ReasoningEnvelope(ReasoningState.OPEN, "<think>", "</think>", open_id, close_id, "\n\n")
    matcher = compiler.compile(regex("(yes|no)"), env)
    steps = [*ids_of(qwen_tokenizer, "\nok\n"), close_id, *ids_of(qwen_tokenizer, "\n\n", "no")]
    assert all(matcher.consume_token(t) for t in steps), matcher.error
    assert allowed(matcher.bitmask(), vocab_size).tolist() == sorted(eos)  # only an EOS may follow


# --- random sampling under a JSON schema ------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "active": {"type": "boolean"},
        "kind": {"enum": ["x", "y", None]},
        "point": {
            "type": "object",
            "properties": {"z": {"type": "integer", "minimum": -5, "maximum": 5}},
            "required": ["z"],
            "additionalProperties": False,
        },
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 3}]},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}

TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def validate(value, schema) -> list[str]:
    """A small JSON-schema validator for the keywords SCHEMA uses; returns the violations."""
    errors = []
    if "anyOf" in schema:
        return [] if any(not validate(value, s) for s in schema["anyOf"]) else [f"{value!r}: no anyOf branch"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{value!r} not in {schema['enum']}")
    kind = schema.get("type")
    if kind == "integer":
        if type(value) is not int:
            return [f"{value!r} is not an integer"]
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            errors.append(f"{value} out of range")
    elif kind is not None and type(value) is not TYPES[kind]:
        return [f"{value!r} is not {kind}"]
    if kind == "string" and len(value) > schema.get("maxLength", len(value)):
        errors.append(f"{value!r} too long")
    if kind == "array":
        if len(value) > schema.get("maxItems", len(value)):
            errors.append("too many items")
        errors += [e for item in value for e in validate(item, schema.get("items", {}))]
    if kind == "object":
        properties = schema.get("properties", {})
        errors += [f"missing {key}" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties", True) is False:
            errors += [f"extra {key}" for key in value if key not in properties]
        errors += [e for key, item in value.items() if key in properties for e in validate(item, properties[key])]
    return errors


def random_allowed(mask: np.ndarray, rng: np.random.Generator) -> int:
    """A uniformly random token among those the mask allows (popcount per word, then the bit)."""
    words = mask.view(np.uint32)
    counts = np.cumsum(np.bitwise_count(words))
    pick = int(rng.integers(counts[-1]))
    word = int(np.searchsorted(counts, pick, side="right"))
    rank = pick - (int(counts[word - 1]) if word else 0)
    bits = [j for j in range(32) if (int(words[word]) >> j) & 1]
    return 32 * word + bits[rank]


def sample(matcher, rng, close_id, max_tokens=400):
    """Uniformly random allowed tokens; the close delimiter is taken with probability 1/4 once allowed."""
    ids = []
    while len(ids) < max_tokens:
        mask = matcher.bitmask()
        if is_allowed(mask, close_id) and rng.random() < 0.25:
            token_id = close_id
        else:
            token_id = random_allowed(mask, rng)
        assert matcher.consume_token(token_id), matcher.error
        ids.append(token_id)
        if token_id == EOS:
            return ids
    raise AssertionError(f"no EOS within {max_tokens} tokens")


def test_200_random_samples_parse_and_validate(compiler, deepseek_tokenizer, think):
    vocab_size = deepseek_tokenizer.get_vocab_size()
    request = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    rng = np.random.default_rng(20261129)
    seen_keys = set()
    compiled = compiler.compile(request, envelope(ReasoningState.OPEN, think, separator="\n\n"))
    for _ in range(200):
        ids = sample(compiled.fork(), rng, think[1])
        assert all(i < vocab_size for i in ids)
        assert ids.count(think[1]) == 1 and ids[-1] == EOS
        answer_ids = ids[ids.index(think[1]) + 1 : -1]
        value = json.loads(deepseek_tokenizer.decode(answer_ids, skip_special_tokens=False))
        assert validate(value, SCHEMA) == [], value
        seen_keys |= set(value)
    assert seen_keys == set(SCHEMA["properties"])  # the sampler explored every property


def test_grammar_errors_are_worded_for_users():
    from helios.frontend.structured.grammar import MAX_ERROR_CHARS, user_message

    panic = "thread '<unnamed>' panicked at parser/src/earley/regexvec.rs:512:9:\nindex out of bounds"
    assert user_message(panic) == "the grammar could not be compiled (it is too large or too complex); simplify it"
    assert user_message("") == "the grammar could not be compiled"
    long = "invalid regex " + "(" * 1000
    assert len(user_message(long + "\n<state>...")) == MAX_ERROR_CHARS + 3
    assert user_message("1(7): unknown name: foo\n<grammar>...") == "1(7): unknown name: foo"


def test_json_schemas_compile_to_compact_json_by_default(deepseek_tokenizer):
    compact = GrammarCompiler.from_tokenizer(deepseek_tokenizer, vocab_size=deepseek_tokenizer.get_vocab_size(),
                                             eos_token_ids=[EOS])
    dense = compact.compile(SCHEMA_ANSWER)
    assert all(dense.consume_token(t) for t in ids_of(deepseek_tokenizer, '{"t":"a b"}')) and dense.is_accepting
    spaced = compact.compile(SCHEMA_ANSWER)
    steps = ids_of(deepseek_tokenizer, "{", '"t"', ":", " ")
    assert not all(spaced.consume_token(t) for t in steps)  # no free whitespace between tokens
    flexible = GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(
        {"type": "object", "properties": {"t": {"type": "string"}}, "x-guidance": {"whitespace_flexible": True}}))
    relaxed = compact.compile(flexible)  # a schema may ask for free whitespace itself
    assert all(relaxed.consume_token(t) for t in ids_of(deepseek_tokenizer, '{ "t" : "x" }')), relaxed.error


def test_a_bounded_reasoning_section_must_close_after_its_budget(compiler, deepseek_tokenizer, think):
    matcher = compiler.compile(SCHEMA_ANSWER, envelope(ReasoningState.OPEN, think, budget=3))
    reasoning = ids_of(deepseek_tokenizer, "one two three")
    assert len(reasoning) == 3 and all(matcher.consume_token(t) for t in reasoning)
    assert allowed(matcher.bitmask(), deepseek_tokenizer.get_vocab_size()).tolist() == [think[1]]
    unopened = compiler.compile(SCHEMA_ANSWER, envelope(ReasoningState.UNOPENED, think, budget=2))
    assert all(unopened.consume_token(t) for t in [think[0], *ids_of(deepseek_tokenizer, "one two")])
    assert allowed(unopened.bitmask(), deepseek_tokenizer.get_vocab_size()).tolist() == [think[1]]


@pytest.mark.parametrize("state", [ReasoningState.OPEN, ReasoningState.UNOPENED])
def test_a_text_close_delimiter_ends_a_budgeted_reasoning_section_where_it_is_written(compiler, deepseek_tokenizer,
                                                                                     state):
    """With a close delimiter spelled as text and a reasoning budget (every structured answer-only
    request has one), the bounded text lexeme swallowed the delimiter the model wrote: the section
    ran on to its budget, so the answer written after the delimiter was reasoning, and the grammar
    then forced the delimiter again before another answer."""
    text_envelope = ReasoningEnvelope(state, "[think]", "[/think]", budget=20)
    matcher = compiler.compile(regex("[0-9]+"), text_envelope)
    opener = "[think]" if state is ReasoningState.UNOPENED else ""
    steps = ids_of(deepseek_tokenizer, opener + "count [/", "think]", "42")
    assert all(matcher.consume_token(t) for t in steps), matcher.error
    assert matcher.is_accepting

"""Structured output with llguidance: request grammars, the reasoning envelope, per-step token masks.

Flow: `parse_response_format` turns the request's `response_format` into a `GrammarRequest` (a JSON
schema's ``$ref``s are checked there: local ones are left to llguidance, which resolves them
itself; remote or dangling ones raise `SchemaRefError`, HTTP 400); during
preparation `GrammarCompiler.compile(request, envelope)` builds the request's `GrammarMatcher` or
raises `GrammarError` (HTTP 400, before admission). Per decode step the worker fills the lane's mask
row with `fill_bitmask` and, after the completion, advances with `consume_token`.

Limits: llguidance builds lexer states lazily, so a grammar can construct fine and exceed `LIMITS`
only when a mask or a token needs those states. Compiling therefore also checks (`check`) the answer
grammar where it hurts most, right after a reasoning section (`PROBE_LARK`): its first masks, a
few tokens along the lowest allowed ids and each first token an output may start with (one per
first byte, `dead_ends.first_token_limit`) must stay out of llguidance's limits, and where that walk
meets a dead end the check searches other tokens for an output that completes (`dead_ends`: it
refuses a grammar only when every output it explored, all there are, dead-ends; within a bound of
masks per check, past which it passes the grammar); and the request's own matcher must compute its
first mask. A recursive JSON schema compiled with whitespace between tokens is probed compact too:
whitespace hid a schema whose every output is endless (`compact_request`). For a JSON schema, the
regexes llguidance compiles (`schema_patterns`) are checked the same way each on its own, so a
pattern no walk reaches is checked too, but at most `PATTERN_PROBES` distinct ones per check (a
request's answer grammar, or all of its tools' parameter schemas together); the rest, like a limit
met deeper in the output, are left to the runtime backstop: the matcher enters its error state and
the runtime ends that request with finish_reason ``grammar_limit`` and the output its grammar took
(an error naming the limit where it took none; `helios.runtime.feedback`), never as a "stop".
Schema shapes llguidance compiles in unbounded time, which no limit stops, are refused before it
sees them (`shape_error`, bounds in `grammar_shapes`: patternProperties per object, patterns on one
string, alternatives holding a $ref in one anyOf/oneOf, the multipleOf values' least common
multiple). One verdict per check (the grammars and their patterns together) is cached
(`VERDICT_CACHE` entries), so a repeated request is one cache hit.

Mask layout (what `helios::apply_grammar_mask` consumes): int32 [ceil(V / 32)] per row, bit j of
word w allows token 32 * w + j, where V is the sampled vocabulary size.

Envelope: the grammar constrains only the answer. When the model has tag reasoning, the top-level
grammar first admits the reasoning section still ahead of the output (free text up to the close
delimiter, generated as its token when the tokenizer has one), then an optional declared separator,
then the request's grammar as an opaque subgrammar, so delimiters spelled inside the answer are
answer text. Matchers never raise on grammar or token errors: they enter llguidance's sticky error
state (`GrammarMatcher.is_error`, `.error`), after which the mask allows only EOS; whoever drives a
matcher reads that state (the compiler at preparation, the model worker's `TensorGrammar` while
decoding, which ends the request with finish_reason ``grammar_limit`` and its output so far; or
``grammar_dead_end`` for a dead end, `GrammarMatcher.is_dead_end`). A request's
reasoning section ahead of a structured answer is bounded where its close delimiter is a token
(`ReasoningEnvelope.budget`, half the request's output limit): the answer always gets the rest of
the output. JSON schemas compile to compact JSON by default (``whitespace_flexible`` off: no free
whitespace between tokens), so a sampled model cannot spend its budget on whitespace; a schema's
own ``x-guidance`` options, or the server's `json_defaults`, may turn it back on. A client's schema
may set only the options that keep its output JSON (`grammar_options`: others are a 400 from
`parse_response_format`).

Requests with tools or recipient frames get a grammar built from the contract's syntax data instead
(`grammar_tools`, `grammar_frames`, chosen by `grammar_request`): `compile_lark` compiles such a
top-level Lark grammar together with the answer grammar it references as ``@answer``.

`GrammarCompiler` is immutable (but for its thread-safe verdict cache and the branch table its first
dead-end search builds) and shared by preparation workers. A `GrammarMatcher` belongs to one request
and is used by one thread at a time.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import llguidance
import numpy as np

from helios.errors import RequestError
from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.preparation.prompt import ReasoningState
from helios.frontend.structured.dead_ends import (REFUSED_TOKEN, BranchVocabulary, SearchBudget, first_token_limit,
                                                  is_dead_end, is_endless, walk)
from helios.frontend.structured.grammar_lark_depth import lark_shape_error
from helios.frontend.structured.grammar_options import OPTIONS_KEY, lark_option_error, option_error
from helios.frontend.structured.grammar_shapes import (SUBSCHEMA_KEYS, SUBSCHEMA_MAPS, dangling_escape_error,
                                                       schema_shape_error)

MASK_WORD_BITS = 32
COMPACT_JSON = {"whitespace_flexible": False}  # llguidance JSON option: no free whitespace
ANSWER_GRAMMAR = "answer"


# llguidance's resource limits, tighter than its defaults where a request controls the cost: the
# number of grammar symbols (request grammars are at most 64 KiB of text; the tool-call envelope and
# JSON schemas expand, hence the margin) and lexer states (1-2 kB each).
LIMITS = llguidance.LLParserLimits(max_grammar_size=200_000, max_lexer_states=50_000)

# The answer grammar after a free-text section closed by one token, as a reasoning envelope places
# it (`envelope_lark`): lexer limits show there at the answer's first masks and tokens, even for
# grammars whose masks stay within the limits at the start of an output.
PROBE_LARK = "start: probe_text <[{token_id}]> @" + ANSWER_GRAMMAR + "\nprobe_text: /(?s:.*)/\n"
PROBE_TOKENS = 3  # answer tokens the check's walk consumes first (the lowest allowed ids)
# Masks one check may compute past those walks, for all its grammars together, searching past a dead
# end for an output that completes (`dead_ends`; a token refused when consumed counts as a mask): a
# check computes at most (grammars + PATTERN_PROBES) * (2 + PROBE_TOKENS) + DEAD_END_MASKS masks (the
# second: `first_token_limit`'s, which then consumes at most 256 + FIRST_TOKEN_SPECIALS tokens on copies).
DEAD_END_MASKS = 48
VERDICT_CACHE = 256  # checks (a grammar, or a request's tool schemas together) whose verdict the compiler keeps
# Distinct schema patterns one check probes on their own (about 1.5 ms each with a 128k vocabulary):
# a schema with thousands of patterns must not cost seconds of preparation CPU.
PATTERN_PROBES = 32


class GrammarError(RequestError):
    """A structured-output request whose grammar is malformed or cannot be compiled; `param` names
    the request field whose grammar it is (``response_format``, ``tools``) where one is at fault."""


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    LARK = "lark"
    CHOICE = "choice"


@dataclass(frozen=True)
class GrammarRequest:
    """What the answer must match. `source`: schema JSON text, regex, Lark text, or JSON array text."""

    kind: GrammarKind
    source: str


def parse_response_format(value: object) -> GrammarRequest | None:
    """OpenAI `response_format` plus the regex/grammar/choice extensions; None for plain text."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarRequest(GrammarKind.JSON_SCHEMA, '{"type": "object"}')
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise GrammarError("response_format.json_schema.schema must be a JSON schema object", "response_format")
        SchemaDocument(schema, "response_format.json_schema.schema", "response_format")  # SchemaRefError: a bad $ref
        _refuse_options("response_format.json_schema.schema", option_error(schema))
        return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    if kind == "regex" and isinstance(value.get("regex"), str) and value["regex"]:
        return GrammarRequest(GrammarKind.REGEX, value["regex"])
    if kind == "grammar" and isinstance(value.get("grammar"), str) and value["grammar"]:
        _refuse_options("response_format.grammar", lark_option_error(value["grammar"]))
        return GrammarRequest(GrammarKind.LARK, value["grammar"])
    if kind == "choice":
        choices = value.get("choices")
        if isinstance(choices, list) and choices and all(isinstance(c, str) and c for c in choices):
            return GrammarRequest(GrammarKind.CHOICE, json.dumps(choices))
        raise GrammarError("response_format.choices must be a non-empty array of non-empty strings", "response_format")
    raise GrammarError("response_format must be text, json_object, json_schema, regex, grammar or choice",
                       "response_format")


def _refuse_options(field: str, error: str) -> None:
    """GrammarError (HTTP 400, naming `field`) for a client schema's llguidance option it may not
    set (`grammar_options`): the server never hands llguidance an option that can break JSON."""
    if error:
        raise GrammarError(f"{field}: {error}", "response_format")


@dataclass(frozen=True)
class ReasoningEnvelope:
    """The reasoning section that may precede the answer, as the prompt left it.

    Delimiters with a token id must be generated as that token; without one they are matched as text.
    `separator` is optional text the model may write between the close delimiter and the answer.
    `budget` bounds the reasoning text in tokens (None: unbounded); once it is spent the grammar
    allows only the close delimiter, so a structured answer always gets the rest of the output. Only
    a close delimiter with a token id can be bounded so (see `envelope_lark`): a text one is not.
    """

    state: ReasoningState
    open_text: str = ""
    close_text: str = ""
    open_token_id: int | None = None
    close_token_id: int | None = None
    separator: str = ""
    budget: int | None = None

    def __post_init__(self):
        if self.state in (ReasoningState.OPEN, ReasoningState.UNOPENED):
            if not (self.close_text or self.close_token_id is not None):
                raise ValueError("a reasoning envelope needs its close delimiter")
        if self.state is ReasoningState.UNOPENED and not (self.open_text or self.open_token_id is not None):
            raise ValueError("an unopened reasoning envelope needs its open delimiter")


    @classmethod
    def from_contract(cls, syntax, state: ReasoningState, separator: str = "") -> ReasoningEnvelope:
        """From a contract `ReasoningSyntax` (serving_pb2) and the prompt's initial reasoning state."""
        return cls(
            state,
            syntax.open,
            syntax.close,
            syntax.open_token_id if syntax.HasField("open_token_id") else None,
            syntax.close_token_id if syntax.HasField("close_token_id") else None,
            separator,
        )


def envelope_lark(envelope: ReasoningEnvelope | None) -> str:
    """Top-level Lark grammar: the pending reasoning section, then the answer subgrammar."""
    answer = f"@{ANSWER_GRAMMAR}"
    if envelope is not None and envelope.separator:
        answer = f"{json.dumps(envelope.separator)}? {answer}"
    if envelope is None or envelope.state in (ReasoningState.CLOSED, ReasoningState.NO_REASONING):
        return f"start: {answer}\n"
    if envelope.close_token_id is not None:
        bounded = f"[max_tokens={envelope.budget}]" if envelope.budget is not None else ""
        body = f"reasoning: reasoning_text <[{envelope.close_token_id}]>\nreasoning_text{bounded}: /(?s:.*)/\n"
    else:
        # A close delimiter spelled as text ends the reasoning where it is written (a lazy `suffix`
        # lexeme), and no budget bounds it: llguidance's lexer takes the longest match, so a bounded
        # text lexeme followed by the delimiter swallowed a delimiter written within the budget (the
        # section ran on to the budget, and the answer the model wrote after its delimiter became
        # reasoning), and a bounded `suffix` lexeme cut at its budget lets the answer follow without
        # the delimiter.
        body = f"reasoning[suffix={json.dumps(envelope.close_text)}]: /(?s:.*)/\n"
    if envelope.state is ReasoningState.OPEN:
        return f"start: reasoning {answer}\n{body}"
    # The separator follows a close delimiter only: an output that never opens reasoning starts
    # with the answer itself (the parser would show a leading separator as answer text).
    opener = f"<[{envelope.open_token_id}]>" if envelope.open_token_id is not None else json.dumps(envelope.open_text)
    return f"start: opened | @{ANSWER_GRAMMAR}\nopened: {opener} reasoning {answer}\n{body}"


def sampled_tokenizer_json(text: str, vocab_size: int) -> str:
    """The tokenizer JSON without its input-only ids (>= `vocab_size`: image placeholders and other
    ids a model reads but never samples), which a grammar over the sampled vocabulary never names."""
    data = json.loads(text)
    added = data.get("added_tokens") or []
    vocab = (data.get("model") or {}).get("vocab")
    if not any(t.get("id", 0) >= vocab_size for t in added) and not (
            isinstance(vocab, dict) and any(i >= vocab_size for i in vocab.values())):
        return text
    data["added_tokens"] = [t for t in added if t.get("id", 0) < vocab_size]
    if isinstance(vocab, dict):
        data["model"]["vocab"] = {token: i for token, i in vocab.items() if i < vocab_size}
    return json.dumps(data)


def spaced_metaspace_json(text: str) -> str:
    """The tokenizer JSON with each Metaspace step of its decoder written as the Replace step it is
    per token (its replacement character read as a space). llguidance reads a sequence holding
    ByteFallback as SentencePiece-style but honours only Replace steps: with a Metaspace step it
    spelled ``▁the`` as a literal U+2581 and ``the`` where the text shows `` the``, so an answer's
    spaces were unconstrained and its ``▁`` words never matched a space. A bare Metaspace decoder
    (not inside a sequence: Unigram models such as T5's) it refuses outright ("can't determine
    decoder type"); it becomes the same Replace step followed by ByteFallback, the marker llguidance
    needs to read the vocabulary as SentencePiece-style (a no-op for the usual such vocabulary, which
    has no ``<0xNN>`` tokens; one that has them would be read as bytes where the bare decoder shows
    their names)."""
    if '"Metaspace"' not in text:
        return text
    data = json.loads(text)
    decoder = data.get("decoder") or {}
    if decoder.get("type") == "Metaspace":
        data["decoder"] = {"type": "Sequence", "decoders": [_metaspace_replace(decoder), {"type": "ByteFallback"}]}
        return json.dumps(data)
    steps = decoder.get("decoders") if decoder.get("type") == "Sequence" else None
    if not steps or not any(step.get("type") == "Metaspace" for step in steps):
        return text
    data["decoder"] = {**decoder, "decoders": [
        _metaspace_replace(step) if step.get("type") == "Metaspace" else step for step in steps]}
    return json.dumps(data)


def _metaspace_replace(step: dict) -> dict:
    """The Replace decoder step a Metaspace step is per token: its replacement character to a space."""
    return {"type": "Replace", "pattern": {"String": step.get("replacement", "\u2581")}, "content": " "}


class ProbeVerdict(NamedTuple):
    """The check's verdict on one grammar: `message` for a client ("" when it passes); `dead_end`
    when every output the check explored (all there are) dead-ended."""

    message: str = ""
    dead_end: bool = False


# The dead-end search budget of the check running in this context (`GrammarCompiler._first_failure`).
_CHECK_BUDGET: contextvars.ContextVar[SearchBudget] = contextvars.ContextVar("helios_check_budget")


class GrammarCompiler:
    """Compiles request grammars against one model's tokenizer and sampled vocabulary."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab_size: int, json_defaults: Mapping | None = None):
        if tokenizer.vocab_size != vocab_size:
            raise ValueError("the llguidance tokenizer must span the sampled vocabulary")
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._json_defaults = {**COMPACT_JSON, **(json_defaults or {})}
        self._eos_ids = frozenset(tokenizer.eos_tokens)
        self._probe_token_id = min(set(range(len(self._eos_ids) + 1)) - self._eos_ids)
        self._verdict = functools.lru_cache(maxsize=VERDICT_CACHE)(self._first_failure)
        self._branches: BranchVocabulary | None = None  # built at the first walk that meets a dead end

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer,
        *,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        json_defaults: Mapping | None = None,
    ) -> GrammarCompiler:
        """From a `tokenizers.Tokenizer` (about a second for a 100k+ vocabulary; build once per model).

        `json_defaults` are llguidance JSON options (for example ``whitespace_pattern``) that a
        schema's own ``x-guidance`` may override.
        """
        text = tokenizer.to_str()
        if tokenizer.get_vocab_size(with_added_tokens=True) > vocab_size:  # it holds input-only ids
            text = sampled_tokenizer_json(text, vocab_size)
        ll_tokenizer = llguidance.LLTokenizer(spaced_metaspace_json(text), n_vocab=vocab_size,
                                              eos_token=list(eos_token_ids))
        return cls(ll_tokenizer, vocab_size, json_defaults)

    @property
    def mask_words(self) -> int:
        return -(-self._vocab_size // MASK_WORD_BITS)

    @property
    def json_options(self) -> dict:
        """The llguidance JSON options every JSON schema here is compiled with (a copy)."""
        return dict(self._json_defaults)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The token's raw bytes as the grammar spells it (a byte token's one byte, not U+FFFD; a
        special token's text), or None for an id outside the sampled vocabulary. Read-only."""
        if not 0 <= token_id < self._vocab_size:
            return None
        return self._tokenizer.decode_bytes([token_id])

    def is_special_token(self, token_id: int) -> bool:
        """Whether llguidance treats the token as special: text rules never produce it."""
        return self._tokenizer.is_special_token(token_id)

    def grammar_text(self, request: GrammarRequest, envelope: ReasoningEnvelope | None = None) -> str:
        """The llguidance top-level grammar (JSON text) for the request inside its envelope."""
        return self.document_text(envelope_lark(envelope), request)

    def document_text(self, lark: str, answer: GrammarRequest | None) -> str:
        """A top-level Lark grammar plus, when given, the answer grammar it references as ``@answer``."""
        grammars = [{"lark_grammar": lark}]
        if answer is not None:
            grammars.append({**self._answer_grammar(answer), "name": ANSWER_GRAMMAR})
        return json.dumps({"grammars": grammars}, ensure_ascii=False)

    def compile(self, request: GrammarRequest, envelope: ReasoningEnvelope | None = None) -> GrammarMatcher:
        """A fresh matcher for one request; GrammarError if the grammar does not compile or exceeds
        llguidance's limits (see `check`)."""
        self.check(request)
        matcher, source = self._matcher(envelope_lark(envelope), request)
        return self._started(matcher, source, f"the {request.kind.value} grammar")

    def compile_lark(self, lark: str, answer: GrammarRequest | None) -> GrammarMatcher:
        """A fresh matcher for a top-level Lark grammar built from syntax data (tool calls, frames)
        and the request's answer grammar; GrammarError naming the part that does not compile."""
        if answer is not None:
            self.check(answer)  # raises when the answer grammar itself is invalid
        matcher, source = self._matcher(lark, answer)
        return self._started(matcher, source, "the tool-call grammar")

    def compile_source(self, source: str) -> GrammarMatcher:
        """A fresh matcher from a matcher's `source` (another process's compile of the same grammar
        against the same tokenizer); GrammarError if it does not compile."""
        matcher = self._rebuild(source)()
        if matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {user_message(matcher.get_error())}")
        return GrammarMatcher(matcher, self.mask_words, source, self._rebuild(source))

    def check(self, request: GrammarRequest) -> None:
        """GrammarError unless `request` compiles and stays within llguidance's limits where an
        answer starts (`PROBE_LARK`), its JSON schema's patterns each on their own too (see
        `first_failure`). Safe to call from any thread."""
        failure = self.first_failure((request,))
        if failure is not None:
            raise GrammarError(failure[1])

    def first_failure(self, requests: Sequence[GrammarRequest]) -> tuple[int, str] | None:
        """(index, error for a client) of the first of `requests` that fails `check`, None when all
        pass. Each grammar is probed whole, then the distinct patterns of their JSON schemas
        (`schema_patterns`; longest first, request by request) on their own, at most
        `PATTERN_PROBES` of them for all `requests` together; patterns past that bound are left to
        the runtime backstop (`helios.runtime.feedback`: a matcher that errors mid-output ends its
        request with finish_reason ``grammar_limit``). The verdict is cached once for the whole tuple, so
        the same requests again are one cache hit. Safe to call from any thread."""
        return self._verdict(tuple(requests))

    def _first_failure(self, requests: tuple[GrammarRequest, ...]) -> tuple[int, str] | None:
        budget = _CHECK_BUDGET.set(SearchBudget(DEAD_END_MASKS))  # one for the check's grammars together
        try:
            return self._first_failure_within(requests)
        finally:
            _CHECK_BUDGET.reset(budget)

    def _first_failure_within(self, requests: tuple[GrammarRequest, ...]) -> tuple[int, str] | None:
        for index, request in enumerate(requests):
            verdict = self._probe(request)
            if not verdict.message and self._may_hide_endless(request):
                verdict = self._probe(compact_request(request))
            if verdict.message:
                return index, verdict.message
        # A pattern alone is probed for llguidance's limits only: its subschema may be a branch the
        # output never needs (an anyOf member), so its dead end is no verdict on the schema and is
        # not searched past.
        _CHECK_BUDGET.set(SearchBudget(0))
        probed, budget = set(requests), PATTERN_PROBES
        for index, request in enumerate(requests):
            for pattern in sorted(schema_patterns(request), key=lambda text: (-len(text), text)):
                alone = string_pattern_request(pattern)
                if alone in probed:
                    continue
                if budget == 0:
                    return None
                probed.add(alone)
                budget -= 1
                verdict = self._probe(alone)
                if verdict.message and not verdict.dead_end:
                    return index, verdict.message
        return None

    def _may_hide_endless(self, request: GrammarRequest) -> bool:
        """Whether the JSON schema `request` holds a ``$ref`` and is compiled with whitespace between
        its tokens (its own ``whitespace_flexible``, or the server's `json_defaults`). Whitespace lets
        a grammar that forces endless text (a required property whose schema requires itself again,
        through a ``$ref``: only refs make a schema recursive) pass the probe: no text is forced, yet
        no output ever completes. The check then probes its compact spelling too (`compact_request`),
        which has the same outputs but for their spaces."""
        if request.kind is not GrammarKind.JSON_SCHEMA or '"$ref"' not in request.source:
            return False
        if self._json_defaults != COMPACT_JSON:
            return True
        try:
            options = json.loads(request.source).get(OPTIONS_KEY)
        except (ValueError, AttributeError):
            return False
        return isinstance(options, Mapping) and options.get("whitespace_flexible") is True

    def _probe(self, request: GrammarRequest) -> ProbeVerdict:
        """The check's verdict on one grammar (its message "" when it passes). After the first mask
        and the probe token, `dead_ends.walk` walks the answer's first tokens and searches past a
        dead end: at most 1 + PROBE_TOKENS masks plus those it takes from the check's `SearchBudget`
        (none for a pattern probed alone). Once the walk passes, each first token of the answer
        (one per first byte) is consumed on a copy: a limit met there refuses the grammar too."""
        shape = shape_error(request)
        if shape:
            return ProbeVerdict(f"invalid {request.kind.value} grammar: {shape}")
        try:
            source = self.document_text(PROBE_LARK.format(token_id=self._probe_token_id), request)
        except GrammarError as error:
            return ProbeVerdict(str(error))
        matcher = GrammarMatcher(llguidance.LLMatcher(self._tokenizer, source, log_level=0, limits=LIMITS),
                                 self.mask_words)
        if matcher.is_error:
            return ProbeVerdict(f"invalid {request.kind.value} grammar: {user_message(matcher.error)}")
        matcher.bitmask()
        matcher.consume_token(self._probe_token_id)
        if matcher.is_error:
            return ProbeVerdict(f"the {request.kind.value} grammar {failure_reason(matcher.error)}")
        # A grammar that counts tokens (max_tokens) is searched token by token, not byte by byte.
        by_bytes = not (request.kind is GrammarKind.LARK and "max_tokens" in request.source)
        result = walk(matcher._matcher, self.mask_words, self._eos_ids, self._branch_vocabulary,
                      walk_masks=PROBE_TOKENS, budget=_CHECK_BUDGET.get(None) or SearchBudget(DEAD_END_MASKS),
                      by_bytes=by_bytes)
        if result.error:
            return ProbeVerdict(f"the {request.kind.value} grammar {failure_reason(result.error)}", result.dead_end)
        limit = first_token_limit(matcher._matcher, self.mask_words, self._branch_vocabulary)
        return ProbeVerdict(f"the {request.kind.value} grammar {failure_reason(limit)}" if limit else "")

    def _branch_vocabulary(self) -> BranchVocabulary:
        if self._branches is None:  # racing threads build the same value
            self._branches = BranchVocabulary.of(self._tokenizer, self._vocab_size)
        return self._branches

    def _started(self, matcher: llguidance.LLMatcher, source: str, what: str) -> GrammarMatcher:
        """The request's matcher once it constructed and computed its first mask (GrammarError otherwise)."""
        if matcher.is_error():
            raise GrammarError(f"{what} does not compile: {user_message(matcher.get_error())}")
        started = GrammarMatcher(matcher, self.mask_words, source, self._rebuild(source))
        started.bitmask()
        if started.is_error:
            raise GrammarError(f"{what} {failure_reason(started.error)}")
        return started

    def _matcher(self, lark: str, answer: GrammarRequest | None) -> tuple[llguidance.LLMatcher, str]:
        source = self.document_text(lark, answer)
        return llguidance.LLMatcher(self._tokenizer, source, log_level=0, limits=LIMITS), source

    def _rebuild(self, source: str) -> Callable[[], llguidance.LLMatcher]:
        """What builds a request's matcher again from its grammar text (`GrammarMatcher`'s rebuild)."""
        return functools.partial(llguidance.LLMatcher, self._tokenizer, source, log_level=0, limits=LIMITS)

    def _answer_grammar(self, request: GrammarRequest) -> dict:
        if request.kind is GrammarKind.JSON_SCHEMA:
            try:
                text = llguidance.LLMatcher.grammar_from_json_schema(request.source, defaults=self._json_defaults)
            except ValueError as error:
                raise GrammarError(f"invalid JSON schema: {user_message(str(error))}") from None
            return json.loads(text)["grammars"][0]
        if request.kind is GrammarKind.REGEX:
            return {"lark_grammar": f"start: /{llguidance.regex_to_lark(request.source)}/"}
        if request.kind is GrammarKind.CHOICE:
            choices = json.loads(request.source)
            return {"lark_grammar": "start: " + " | ".join(json.dumps(choice) for choice in choices)}
        return {"lark_grammar": request.source}


MAX_ERROR_CHARS = 240
_INTERNAL_MARKS = ("panicked", "RUST_BACKTRACE", "called `Option::unwrap()`", "called `Result::unwrap()`", ".rs:")


def user_message(message: str) -> str:
    """llguidance's error worded for a client: its first line (with the lines after it when the
    first only introduces them, as ``regex parse error:`` does), at most `MAX_ERROR_CHARS`, and never
    the text of an internal failure (a Rust panic, source locations), which says nothing to a user."""
    text = message.strip()
    if not text:
        return "the grammar could not be compiled"
    if any(mark in text for mark in _INTERNAL_MARKS):
        return "the grammar could not be compiled (it is too large or too complex); simplify it"
    first, *rest = text.splitlines()
    line = first.strip()
    if line.endswith(":"):  # the detail is on the next lines; carets and gutters only point into them
        details = [part.strip() for part in rest if part.strip(" ^|~0123456789")]
        details = [part if len(part) <= 80 else part[:80] + "..." for part in details]  # an echoed pattern
        line = " ".join([line, "; ".join(details)])
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS] + "..."


def failure_reason(error: str) -> str:
    """Why a matcher that constructed entered its error state at a mask or token, for a client:
    a dead end (no token can follow and the output is not complete: the grammar, or every part of
    it the check explored, matches no text) or a limit llguidance met. The item limit met forcing
    endless text (`dead_ends.is_endless`) says so instead of llguidance's hint about short lexemes,
    which does not apply."""
    if is_dead_end(error):
        return ("reaches a dead end: every output it allows stops where no token can follow and the output "
                "is not complete (an empty class such as [^\\s\\S], a rule that never ends, or text the "
                "vocabulary cannot spell)")
    if is_endless(error):
        limit = user_message(error).split("; try ", 1)[0]
        return (f"exceeds llguidance's limits: {limit}: it forces the text after a token and that text never "
                "ends (a repetition beside what matches nothing, such as (\"a\")* before [^\\s\\S])")
    return f"exceeds llguidance's limits: {user_message(error)}"


def shape_error(request: GrammarRequest) -> str:
    """Why a JSON-schema request's shape is one llguidance compiles in unbounded time (its error for
    a client, see `grammar_shapes`), or a Lark request's one its compile recurses too deep through
    (`grammar_lark_depth`), or a regex request's malformed escape llguidance would drop
    (`dangling_escape_error`), or "" when it is none of these (and for other kinds of grammar)."""
    if request.kind is GrammarKind.LARK:
        return lark_shape_error(request.source)
    if request.kind is GrammarKind.REGEX:
        return dangling_escape_error(request.source)
    return schema_shape_error(request.source) if request.kind is GrammarKind.JSON_SCHEMA else ""


def compact_request(request: GrammarRequest) -> GrammarRequest:
    """The JSON-schema `request` without whitespace between tokens, whatever its own options and the
    server's defaults say (a server-side spelling: a client may not set ``whitespace_pattern``)."""
    schema = json.loads(request.source)
    if not isinstance(schema, dict):
        return request
    own = schema.get(OPTIONS_KEY)
    options = {**(own if isinstance(own, Mapping) else {}), "whitespace_flexible": False, "whitespace_pattern": None}
    return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({**schema, OPTIONS_KEY: options}))


def string_pattern_request(pattern: str) -> GrammarRequest:
    """The JSON schema of a string matching `pattern` (how `check` tries a schema's patterns alone)."""
    return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({"type": "string", "pattern": pattern}))


def schema_patterns(request: GrammarRequest) -> set[str]:
    """The regexes of a JSON-schema request where llguidance compiles them: the ``pattern`` of a
    (sub)schema and the keys of its ``patternProperties``, walking only the keywords that hold
    subschemas llguidance honours (`SUBSCHEMA_KEYS`, `SUBSCHEMA_MAPS`); never data (``enum``,
    ``const``, ``default``, ...), vendor ``x-*`` keys or keywords llguidance ignores."""
    if request.kind is not GrammarKind.JSON_SCHEMA:
        return set()
    try:
        schema = json.loads(request.source)
    except ValueError:
        return set()
    return set(_patterns(schema))


def _patterns(schema: Any) -> Iterator[str]:
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        for key, value in node.items():
            if key in SUBSCHEMA_MAPS and isinstance(value, dict):
                if key == "patternProperties":
                    yield from value
                stack.extend(value.values())
            elif key in SUBSCHEMA_KEYS:
                stack.extend(value if isinstance(value, list) else [value])


def allocate_bitmasks(num_rows: int, mask_words: int) -> np.ndarray:
    """int32 [num_rows, mask_words] with every token allowed (the state of unconstrained rows)."""
    return np.full((num_rows, mask_words), -1, dtype=np.int32)


class GrammarMatcher:
    """One request's grammar state over generated tokens (EOS included once the answer is complete).
    `source`: the top-level grammar text it was compiled from (None for a fork), from which
    `GrammarCompiler.compile_source` builds the same fresh matcher elsewhere. `rebuild` (None: the
    matcher cannot) makes that fresh llguidance matcher here, into which the masks and tokens taken
    so far are replayed where a limit may have come from another matcher's work (`fork`).

    Copies share the lexer: llguidance's `deep_copy` clones the parser's own state (its Earley rows,
    items, token count and parser error) but shares the lexer behind one lock (its DFA and the states
    it built, their `max_lexer_states` count, and its sticky error: a copy's mask that runs out of
    step fuel, "too many expressions constructed", puts every matcher of that lexer in the error
    state at its next mask or token). So the work on a copy (a trial in `fill_draft_bitmasks` or
    `_refuses_all`, a sibling `fork`) counts toward this matcher's limits too, and llguidance offers
    no copy with a lexer of its own short of compiling the grammar again. Where this matcher meets a
    limit after a copy shared its lexer, it is built again from the grammar (`rebuild`), its own masks
    and tokens replayed in their order (the states a lexer holds depend on the masks it computed too:
    replayed without them, `[b-z]{40} a{100000}` took the "a" whose forced text meets the state limit
    after its masks), and the mask or token tried once more on a lexer holding only its own work: the
    limit it then meets is the one it meets alone. A compile and replay happen only then, never on
    the common path. `_refuses_all` only consumes a token on its copies (the bytes its mask just walked,
    and the text that token forces): it counts as sharing only where one of them met a limit, so a
    request that never drafts nor forks is never rebuilt."""

    def __init__(self, matcher: llguidance.LLMatcher, mask_words: int, source: str | None = None,
                 rebuild: Callable[[], llguidance.LLMatcher] | None = None):
        self._matcher = matcher
        self._mask_words = mask_words
        self.source = source
        self._rebuild = rebuild
        self._steps: list[int | None] = []  # its masks (None) and tokens in order, replayed when rebuilt
        self._is_shared = False  # a copy shares the lexer: a limit may be another matcher's
        self._is_unspellable = False  # the last mask allowed only tokens llguidance then refuses

    @property
    def is_error(self) -> bool:
        return self._matcher.is_error()

    @property
    def error(self) -> str:
        return self._matcher.get_error()

    @property
    def is_dead_end(self) -> bool:
        """No token can follow the output, which is not complete (found by the last mask; the
        runtime ends the request there: GRAMMAR_DEAD_END): llguidance's error state for a dead end,
        or a mask that allows only tokens llguidance then refuses. Where the grammar needs text the
        vocabulary cannot spell (a character without a token, no byte fallback), llguidance's mask
        lets the unknown-word token through instead of finding a dead end, and refuses it when it
        comes; that token would be written as output before the request failed."""
        if self._matcher.is_error():
            return is_dead_end(self._matcher.get_error())
        return self._is_unspellable

    @property
    def is_accepting(self) -> bool:
        """The answer is complete: EOS is allowed now."""
        return self._matcher.is_accepting()

    @property
    def is_stopped(self) -> bool:
        """No token but EOS can follow (also true in the error state)."""
        return self._matcher.is_stopped()

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Writes the next step's allowed tokens into `out` (int32 [mask_words], C-contiguous)."""
        if out.dtype != np.int32 or out.shape != (self._mask_words,) or not out.flags["C_CONTIGUOUS"]:
            raise ValueError(f"mask row must be C-contiguous int32 [{self._mask_words}]")
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        if self._is_rebuilt_after_shared_limit():
            self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._steps.append(None)
        self._is_unspellable = self._refuses_all(out)

    def _refuses_all(self, mask: np.ndarray) -> bool:
        """Whether `mask` (just computed) allows only tokens this matcher would refuse as not
        satisfying the grammar (not for a limit): checked on copies, where the mask allows one word's
        tokens at most and not EOS (an unknown-word token)."""
        words = np.flatnonzero(mask)
        if words.size != 1 or self._matcher.is_error() or self._matcher.is_accepting():
            return False
        word = int(mask[words[0]]) & 0xFFFFFFFF
        for token_id in (MASK_WORD_BITS * int(words[0]) + bit for bit in range(MASK_WORD_BITS) if word >> bit & 1):
            probe = self._matcher.deep_copy()
            if probe.consume_token(token_id):
                return False  # a token it takes
            if REFUSED_TOKEN not in probe.get_error():
                self._is_shared = True  # the limit it met is in the lexer this matcher shares (see the class)
                return False  # a token that meets a limit (an error when it comes)
        return True

    def bitmask(self) -> np.ndarray:
        out = np.empty(self._mask_words, dtype=np.int32)
        self.fill_bitmask(out)
        return out

    def consume_token(self, token_id: int) -> bool:
        """Advances by one generated token; False (and a sticky error) if the grammar forbids it."""
        accepted = self._matcher.consume_token(token_id)
        if not accepted and self._is_rebuilt_after_shared_limit():
            accepted = self._matcher.consume_token(token_id)
        if accepted:
            self._steps.append(token_id)
        return accepted

    def fork(self) -> GrammarMatcher:
        """A copy of the current state that advances on its own. It shares the compiled grammar and
        the lexer (see the class): either one that then meets a limit is rebuilt before it reports it."""
        self._is_shared = True
        fork = GrammarMatcher(self._matcher.deep_copy(), self._mask_words, rebuild=self._rebuild)
        fork._steps, fork._is_shared = list(self._steps), True
        return fork

    def _trial(self) -> GrammarMatcher:
        """A copy for trial work whose result is read, not kept: it reports a limit as it meets it."""
        self._is_shared = True
        return GrammarMatcher(self._matcher.deep_copy(), self._mask_words)

    def _is_rebuilt_after_shared_limit(self) -> bool:
        """Whether this matcher, in the error state for a limit (not a dead end or a refused token)
        while a copy shared its lexer, was built again from its grammar with its own masks and tokens
        (see the class): the caller then repeats what met the limit."""
        if self._rebuild is None or not self._is_shared or not self._matcher.is_error():
            return False
        error = self._matcher.get_error()
        if is_dead_end(error) or REFUSED_TOKEN in error:
            return False
        fresh = self._rebuild()
        for token_id in self._steps:
            if token_id is None:
                fresh.compute_bitmask()
            else:
                fresh.consume_token(token_id)
        self._matcher, self._is_shared = fresh, False
        return True

    def fill_draft_bitmasks(self, draft_ids: Sequence[int], out: np.ndarray) -> int:
        """Masks for a speculative round: row k constrains the target token after draft_ids[:k].

        `out` is int32 [len(draft_ids) + 1, mask_words]. Rows after the first draft the grammar
        rejects repeat that position's mask (verification cannot accept past it). Works on a copy,
        so this matcher is unchanged (a limit the copy meets is not this matcher's: see the class);
        returns how many drafts the grammar accepts.
        """
        if out.shape != (len(draft_ids) + 1, self._mask_words):
            raise ValueError("draft mask rows must be [len(draft_ids) + 1, mask_words]")
        probe = self._trial()
        valid = 0
        probe.fill_bitmask(out[0])
        for token_id in draft_ids:
            if not probe.consume_token(token_id):
                break
            valid += 1
            probe.fill_bitmask(out[valid])
        out[valid + 1 :] = out[valid]
        return valid

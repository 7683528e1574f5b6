"""Golden-case machinery: real tokenizers, token-by-token detokenization and feeding strategies.

A golden output is a list of segments. A `str` segment is encoded by the tokenizer as a whole, so
spellings of added tokens in it become those tokens; a `Plain` segment is encoded in two separate
parts, so a delimiter spelled in it is generated as ordinary text pieces, never as its token.
Generated ids are turned back into per-token text by the project's `IncrementalDetokenizer`, then
fed to a pipeline:

- `one_token`: one feed per token, as generation produces them;
- `random_chunks`: the same text cut at random places (tokens merged, text moved to later tokens,
  empty feeds for incomplete characters); a registered delimiter token always ends its feed;
- `coarsest`: as few feeds as the feeding contract allows: cut only after delimiter tokens.
  For outputs without delimiter tokens this is the whole output at once.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from helios.frontend.decoding.detokenize import IncrementalDetokenizer
from helios.frontend.decoding.events import (
    ContentDelta,
    Event,
    MarkupDropped,
    ParseError,
    ParseErrorKind,
    ParseResult,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from helios.frontend.parsers import OutputPipeline, TokenDelimiters

FILLER_ID = 10**9  # an id no tokenizer here uses: "some ordinary token"
Feed = tuple[int, str]


@dataclass(frozen=True)
class Plain:
    text: str


def encode(tokenizer, segments: Sequence[str | Plain]) -> list[int]:
    ids: list[int] = []
    for segment in segments:
        if isinstance(segment, Plain):
            for part in (segment.text[:2], segment.text[2:]):
                ids += tokenizer.encode(part, add_special_tokens=False).ids
        else:
            ids += tokenizer.encode(segment, add_special_tokens=False).ids
    return ids


def detokenize(tokenizer, ids: Sequence[int]) -> list[Feed]:
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    feeds = [(token_id, detokenizer.feed(token_id)) for token_id in ids]
    rest = detokenizer.finish()
    if rest:
        feeds[-1] = (feeds[-1][0], feeds[-1][1] + rest)
    return feeds


def delimiters_for(tokenizer, spellings: Sequence[str]) -> TokenDelimiters:
    return TokenDelimiters.from_encoder(spellings, lambda s: tokenizer.encode(s, add_special_tokens=False).ids)


def _anchors(stream: Sequence[Feed], delimiters: TokenDelimiters) -> tuple[dict[int, int], set[int]]:
    """Text offset at the end of each delimiter token -> its id; offsets inside delimiter spellings
    (a delimiter token's own text always arrives whole, at the end of its feed)."""
    anchors, inside, offset = {}, set(), 0
    for token_id, text in stream:
        offset += len(text)
        spelling = delimiters.text_of(token_id)
        if spelling is not None:
            anchors[offset] = token_id
            inside.update(range(offset - len(spelling) + 1, offset))
    return anchors, inside


def _cut(stream: Sequence[Feed], delimiters: TokenDelimiters, cuts: set[int]) -> list[Feed]:
    text = "".join(t for _, t in stream)
    anchors, inside = _anchors(stream, delimiters)
    points = sorted({p for p in cuts if 0 < p < len(text)} - inside | set(anchors) | {len(text)})
    feeds, start = [], 0
    for point in points:
        feeds.append((anchors.get(point, FILLER_ID), text[start:point]))
        start = point
    return feeds


def one_token(stream: Sequence[Feed], delimiters: TokenDelimiters) -> list[Feed]:
    return list(stream)


def coarsest(stream: Sequence[Feed], delimiters: TokenDelimiters) -> list[Feed]:
    return _cut(stream, delimiters, set())


def random_chunks(stream: Sequence[Feed], delimiters: TokenDelimiters, rng: random.Random) -> list[Feed]:
    size = sum(len(t) for _, t in stream)
    density = rng.choice([0.05, 0.2, 0.5, 1.0])
    feeds = _cut(stream, delimiters, {p for p in range(1, size) if rng.random() < density})
    out = []
    for feed in feeds:
        while rng.random() < 0.1:
            out.append((FILLER_ID, ""))  # a token whose character is not complete yet
        out.append(feed)
    return out


@dataclass
class Run:
    events: list[Event]
    result: ParseResult


def control_feeds(controls: dict[str, int], text: str, size: int) -> list[tuple[int, str]]:
    """`text` as feeds: each control spelling in `controls` as its own token, the other text in pieces of
    `size` characters (`FILLER_ID`)."""
    feeds, plain, at = [], "", 0
    while at < len(text):
        control = next((c for c in controls if text.startswith(c, at)), None)
        if control is None:
            plain, at = plain + text[at], at + 1
            continue
        feeds += [(FILLER_ID, plain[i : i + size]) for i in range(0, len(plain), size)]
        feeds.append((controls[control], control))
        plain, at = "", at + len(control)
    return feeds + [(FILLER_ID, plain[i : i + size]) for i in range(0, len(plain), size)]


def run(pipeline: OutputPipeline, feeds: Sequence[Feed]) -> Run:
    events: list[Event] = []
    for token_id, text in feeds:
        events += pipeline.feed(token_id, text)
    events += pipeline.finish()
    return Run(events, pipeline.result())


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict
    complete: bool = True


@dataclass(frozen=True)
class Expect:
    reasoning: str = ""
    content: str = ""
    calls: tuple[Call, ...] = ()
    errors: tuple[ParseErrorKind, ...] = ()
    markup_contains: tuple[str, ...] = field(default=())


def check_stream_invariants(events: Sequence[Event], result: ParseResult, id_prefix: str) -> None:
    """Deltas concatenate to the result; tool-call events are well ordered; arguments are JSON."""
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == result.reasoning
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == result.content
    assert "".join(e.text for e in events if isinstance(e, MarkupDropped)) == result.markup
    assert tuple(e for e in events if isinstance(e, ParseError)) == result.errors
    assert all(e.text for e in events if isinstance(e, (ReasoningDelta, ContentDelta, MarkupDropped)))
    open_calls: dict[int, list[str]] = {}
    ended: dict[int, str] = {}
    for event in events:
        if isinstance(event, ToolCallStart):
            assert event.index == len(open_calls) + len(ended) and event.index not in ended
            assert event.call_id == f"{id_prefix}{event.index}"
            open_calls[event.index] = []
        elif isinstance(event, ToolCallArguments):
            assert event.fragment
            open_calls[event.index].append(event.fragment)
        elif isinstance(event, ToolCallEnd):
            ended[event.index] = "".join(open_calls.pop(event.index))
    assert not open_calls
    assert [c.arguments for c in result.tool_calls] == [ended[i] for i in sorted(ended)]
    for arguments in ended.values():
        assert isinstance(json.loads(arguments), dict)


def check_expected(result: ParseResult, expect: Expect) -> None:
    assert result.reasoning == expect.reasoning
    assert result.content == expect.content
    got = [Call(c.name, json.loads(c.arguments), c.complete) for c in result.tool_calls]
    assert got == list(expect.calls)
    assert [e.kind for e in result.errors] == list(expect.errors)
    for markup in expect.markup_contains:
        assert markup in result.markup


def check_golden(make: Callable[[], OutputPipeline], stream: Sequence[Feed], delimiters: TokenDelimiters,
                 expect: Expect, seed: int | str, num_random: int = 20, id_prefix: str = "call_") -> ParseResult:
    """Runs every feeding strategy; all must give the expected, identical result."""
    reference = run(make(), one_token(stream, delimiters))
    check_stream_invariants(reference.events, reference.result, id_prefix)
    check_expected(reference.result, expect)
    rng = random.Random(seed)
    strategies = [coarsest(stream, delimiters)] + [random_chunks(stream, delimiters, rng) for _ in range(num_random)]
    for feeds in strategies:
        other = run(make(), feeds)
        check_stream_invariants(other.events, other.result, id_prefix)
        assert other.result == reference.result, feeds
    return reference.result

"""One request's output path: generated ids -> observation, detokenization, stops, parsers.

`OutputProcessor.feed(token_id, observed_ns)` takes the engine's generated ids one at a time, in
order, and returns an `OutputStep`:

1. observation: observed requests record every raw id (EOS and stop-hidden tokens included) and,
   when timed, the scheduler's completion timestamp for it;
2. EOS ids end the output and are not decoded or parsed;
3. the id is detokenized (special tokens kept, so envelope markup is in the text);
4. string stops match that decoded text before presentation, reasoning and tool envelopes
   included, and the part of the text the detokenizer still holds (behind an open character or a
   run of stray bytes) that no later id changes, as it becomes known: a stop completed there takes
   effect on this token, as if that text had been shown (`_stop_ahead_text`); token stops match
   the ids, before they are detokenized: ids that could begin a stop sequence are held, and a
   match detokenizes only the ids before it and flushes the detokenizer, so the text shown is the
   whole decode of those ids (text the detokenizer held for them, an open character as U+FFFD, is
   never dropped with the stop's ids). A match sets `OutputStep.is_stopped`:
   the caller cancels the rest of the generation, and any later token is ignored;
5. the text the stops release goes to the parser pipeline, one token's text per feed: text a stop
   matcher held back and released later still reaches the parsers token by token, so a delimiter
   token always ends its feed (the parsers' feeding contract). Only the visible part of a token
   that a stop cut is fed as plain text.

A request that asks for log-probabilities (built with `TokenTexts`) passes each token's
`TokenLogprobs` with it; every token fed after step 2 (not EOS, not after a stop) becomes a
`LogprobEntry` (`helios.frontend.decoding.logprobs`), which travels with the token's text: it is in
the step that hands that text on (a later one when a stop matcher held the text back), or in the
final record's entries alone when the text is flushed at the end; a token whose whole text a stop
hides gets no entry (one the stop cuts keeps its entry), so the entries are those of the text returned.
On a core that cleans up tokenization spaces, an entry also waits for the text that decides whether
the cleanup removes a space before its token (`_hand_on`), so its offset counts the text returned.

A request run through scored prefill (`PromptScoring`) gets its prompt tokens' scores through
`score_prompt` before its first token; the first step fed after them (or the final record) carries
every prompt token's `LogprobEntry` (logprob None for the first token). ``max_tokens: 0`` requests hide
their output: every fed token is ignored and counts nothing.

`finish(reason, reused_prompt_tokens)` flushes held text (EOS and output limits release an
unmatched stop prefix) and returns the `OutputFinal`: usage (every token fed counts, including the
one that crossed a stop; its details: the reused prompt tokens as cached, and the tokens the
parsers read as reasoning), the parse result and the observation record. The grammar matcher is not
advanced here: the model worker does that before computing the next mask.

An `OutputProcessor` belongs to one request and is driven by one thread at a time.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer, lossy_utf8
from helios.frontend.decoding.events import Event, ParseResult
from helios.frontend.decoding.logprobs import LogprobEntry, PromptScoring, TokenTexts
from helios.frontend.decoding.observation import (
    ObservationClock,
    ObservationOptions,
    ObservationRecord,
    TokenObservation,
    observation_record,
)
from helios.frontend.parsers import OutputPipeline
from helios.frontend.decoding.stops import StopMatcher, StringStopMatcher, TokenStopMatcher
from helios.runtime.records.events import FinishReason, PromptScoresEvent, TokenLogprobs

NOT_A_TOKEN = -1  # id fed with text that no single generated token ends (flushed or cut text)
Segment = tuple[int, str]


@dataclass(frozen=True)
class Usage:
    """OpenAI usage: prompt tokens and generated tokens (EOS and stop-crossing tokens included), with
    their details: the prompt tokens served from the prefix cache or a snapshot (the engine's count
    at first admission, `FinishEvent.num_reused_tokens`) and the generated tokens that were
    reasoning (`OutputPipeline.num_reasoning_tokens`)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class OutputStep:
    """What one generated token produced. `observation` is set for observed requests only."""

    observation: TokenObservation | None
    events: tuple[Event, ...]
    is_stopped: bool
    logprobs: tuple[LogprobEntry, ...] = ()  # the token's entry, for requests that ask
    prompt_logprobs: tuple[LogprobEntry, ...] | None = None  # the prompt's, on the first step after them
    num_output_tokens: int = 0  # output tokens usage counts so far, this one's included (continuous usage)


@dataclass(frozen=True)
class OutputFinal:
    """The end of an output: flushed events, the finish reason, usage, result and observation."""

    events: tuple[Event, ...]
    reason: FinishReason
    usage: Usage
    result: ParseResult
    observation: ObservationRecord | None
    logprobs: tuple[LogprobEntry, ...] | None = None  # every entry, for requests that ask
    prompt_logprobs: tuple[LogprobEntry, ...] | None = None  # requests run through scored prefill


class PendingText:
    """Per-token texts given to a stop matcher and not yet handed on, in order, each with its
    token's log-probability entries (none, or the token's one).

    A matcher releases a prefix of the concatenated text; only segments it released completely
    leave (`release`), so a token's text is handed on whole, with its entries. A segment's text may
    begin with text of earlier tokens that the space cleanup held back (its `carried` characters).
    Owned by one `OutputProcessor`.
    """

    def __init__(self) -> None:
        self._segments: deque[Segment] = deque()
        self._entries: deque[tuple[LogprobEntry, ...]] = deque()  # one item per segment
        self._carried: deque[int] = deque()  # one item per segment
        self._num_released = 0  # released characters at the front of the first segment
        self._num_texts = 0  # segments with text
        self._first = 0  # the first of them (while there is one): found once, not on each release

    def __bool__(self) -> bool:
        return bool(self._segments)

    def push(self, token_id: int, text: str, entries: tuple[LogprobEntry, ...] = (), carried: int = 0) -> None:
        if text:
            if not self._num_texts:
                self._first = len(self._segments)
            self._num_texts += 1
        self._segments.append((token_id, text))
        self._entries.append(entries)
        self._carried.append(carried)

    def release(self, num_chars: int) -> tuple[list[Segment], list[LogprobEntry]]:
        """Adds `num_chars` released characters; returns the segments now released completely and
        their entries. A segment without text (a token whose character a later token completes)
        leaves with the next segment that has text, so a stop that hides that text hides its entry."""
        self._num_released += num_chars
        out, entries = [], []
        while (end := self._first_text()) is not None and len(self._segments[end][1]) <= self._num_released:
            for _ in range(end + 1):
                out.append(self._segments.popleft())
                entries.extend(self._entries.popleft())
                self._carried.popleft()
            self._num_released -= len(out[-1][1])
            self._num_texts -= 1
            if self._num_texts:
                self._first = next(index for index, (_, text) in enumerate(self._segments) if text)
        return out, entries

    def release_all(self) -> tuple[list[Segment], list[LogprobEntry]]:
        """The end of an output without a stop: every remaining segment (none has text left)."""
        out, entries = list(self._segments), [entry for item in self._entries for entry in item]
        self._segments.clear()
        self._entries.clear()
        self._carried.clear()
        self._num_texts = 0
        return out, entries

    @property
    def has_text(self) -> bool:
        return self._first_text() is not None

    def _first_text(self) -> int | None:
        return self._first if self._num_texts else None

    def cut(self) -> tuple[list[Segment], list[LogprobEntry]]:
        """A stop matched: the released part of the first segment with text, as plain text, with the
        entries of the tokens whose text starts in it (that segment's text can begin with the text of
        the tokens without text before it, after the text it carries); drops the rest (text the stop
        hides, its tokens' entries)."""
        out, entries = [], []
        end = self._first_text()
        if end is not None and self._num_released:
            out.append((NOT_A_TOKEN, self._segments[end][1][: self._num_released]))
            group = [entry for index in range(end + 1) for entry in self._entries[index]]
            num_held = len(group) - len(self._entries[end])  # the tokens before the segment's own
            entries.extend(entry for entry, start in zip(group, _text_starts(group, self._carried[end], num_held))
                           if start < self._num_released)
        self._segments.clear()
        self._entries.clear()
        self._carried.clear()
        self._num_texts = 0
        self._num_released = 0
        return out, entries


def _text_starts(group: Sequence[LogprobEntry], carried: int = 0, num_before: int | None = None) -> list[int]:
    """Where each token of a held group (tokens that showed no text, then the one whose delta shows
    theirs and its own) starts in that delta: the characters the tokens before it complete, counted
    as `TextOffsets` counts a token with a character open, and a token that continues an open
    character where that character begins. The delta begins with `carried` characters that the space
    cleanup held back: the text of the group's first tokens whose whole text it held (their own
    text shown, `LogprobEntry.shown`, though their step showed none) and of tokens before them; of
    the group, `num_before` (all but the last when None) are tokens before the delta's own."""
    num_before = len(group) - 1 if num_before is None else num_before
    num_held = 0  # the group's first tokens' text, held by the cleanup
    for entry in group[:num_before]:
        if not (entry.settled and entry.shown):
            break
        num_held += len(entry.shown)
    starts, num_chars, open_bytes = [], max(0, carried - num_held), b""
    for index, entry in enumerate(group):
        starts.append(num_chars)
        if index < num_before and entry.settled and entry.shown and num_chars < carried:
            num_chars = min(carried, num_chars + len(entry.shown))
        elif not open_bytes and REPLACEMENT_CHAR not in entry.text:
            num_chars = max(num_chars, carried) + len(entry.text)
        else:
            num_complete, open_bytes = lossy_utf8(open_bytes + entry.token_bytes)
            num_chars = max(num_chars, carried) + num_complete
    return starts


class OutputProcessor:
    """Turns one request's generated ids into parser events; see the module docstring."""

    def __init__(
        self,
        detokenizer: IncrementalDetokenizer,
        pipeline: OutputPipeline,
        stops: StopMatcher | None,
        eos_token_ids: Sequence[int],
        observation: ObservationOptions,
        prompt_token_ids: Sequence[int],
        ingress_ns: int | None = None,
        token_texts: TokenTexts | None = None,
        prompt_scoring: PromptScoring | None = None,
    ):
        if observation.is_timed and ingress_ns is None:
            raise ValueError("a timed request needs its ingress timestamp")
        self._detokenizer = detokenizer
        self._pipeline = pipeline
        self._stops = stops
        self._token_stops = stops if isinstance(stops, TokenStopMatcher) else None
        self._string_stops = stops if isinstance(stops, StringStopMatcher) else None
        self._num_looked_ahead = 0  # characters of the detokenizer's pending text the string stops looked at
        self._held: deque[tuple[int, TokenLogprobs | None]] = deque()  # ids token stops hold, not yet decoded
        self._pending = PendingText()
        self._eos = frozenset(eos_token_ids)
        self._observation = observation
        self._prompt_token_ids = tuple(prompt_token_ids)
        self._ingress_ns = ingress_ns
        self._enqueue_ns: int | None = None
        self._token_ids: list[int] = []
        self._timestamps_ns: list[int] = []
        self._token_texts = token_texts  # None: the request asks for no log-probabilities
        self._logprobs: list[LogprobEntry] = []
        # Space cleanup: entries handed on whose `removed` it has not decided (held until it does), and
        # each entry made so far with where its token's text starts in the text before the cleanup.
        self._undecided: deque[LogprobEntry] = deque()
        self._entry_starts: deque[tuple[LogprobEntry, int]] = deque()
        self._prompt_scoring = prompt_scoring
        self._prompt_entries: list[LogprobEntry] | None = None
        self._is_prompt_pending = prompt_scoring is not None and prompt_scoring.scores  # not yet on a step
        if self._is_prompt_pending:  # a token without a score (the first) keeps logprob None
            self._prompt_entries = [prompt_scoring.texts.entry(t, None) for t in self._prompt_token_ids]
        self._num_tokens = 0
        self._is_ended = False  # EOS seen or a stop matched: later tokens are ignored
        self._is_stopped = False
        self._is_finished = False

    @property
    def is_stopped(self) -> bool:
        """A user stop matched; the engine should generate nothing more for this request."""
        return self._is_stopped

    @property
    def num_output_tokens(self) -> int:
        return self._num_tokens

    def mark_enqueue(self, clock: ObservationClock) -> None:
        """Stamps the enqueue time just before model submission; reads the clock only when timed."""
        if self._observation.is_timed:
            if self._enqueue_ns is not None:
                raise ValueError("enqueue already stamped")
            self._enqueue_ns = clock.now_ns()

    def score_prompt(self, event: PromptScoresEvent) -> None:
        """Records scores of prompt tokens (requests run through scored prefill only)."""
        if self._prompt_entries is None:
            raise ValueError("prompt scores for a request that did not ask for them")
        for offset, values in enumerate(event.scores):
            index = event.first_index + offset
            self._prompt_entries[index] = self._prompt_scoring.texts.entry(
                self._prompt_token_ids[index], values, self._prompt_scoring.num_top)

    def feed(self, token_id: int, observed_ns: int | None = None, logprobs: TokenLogprobs | None = None) -> OutputStep:
        """One generated id (with the scheduler's completion timestamp for timed requests, and its
        log-probabilities for requests that ask)."""
        step = self._feed(token_id, observed_ns, logprobs)
        if self._is_prompt_pending:
            self._is_prompt_pending = False
            step = dataclasses.replace(step, prompt_logprobs=tuple(self._prompt_entries))
        return step

    def _feed(self, token_id: int, observed_ns: int | None, logprobs: TokenLogprobs | None) -> OutputStep:
        if self._is_finished:
            raise ValueError("feed after finish")
        if self._prompt_scoring is not None and not self._prompt_scoring.shows_output:
            return OutputStep(None, (), False)
        if self._is_ended:
            return OutputStep(None, (), self._is_stopped, num_output_tokens=self._num_tokens)
        self._num_tokens += 1
        observation = self._observe(token_id, observed_ns)
        if token_id in self._eos:
            self._is_ended = True
            return OutputStep(observation, (), False, num_output_tokens=self._num_tokens)
        if self._token_stops is not None:
            return self._feed_token_stops(observation, token_id, logprobs)
        text = self._detokenizer.feed(token_id)
        entry = self._logprob_entry(token_id, logprobs)
        if text:
            self._num_looked_ahead = 0
        elif self._string_stops is not None:
            text = self._stop_ahead_text()
        if self._stops is None:
            return OutputStep(observation, tuple(self._parse([(token_id, text)])), False, self._hand_on(entry),
                              num_output_tokens=self._num_tokens)
        result = self._stops.feed(token_id, text)
        self._pending.push(token_id, text, entry, self._detokenizer.num_carried)
        segments, entries = self._pending.release(len(result.emit_text))
        if result.matched:
            cut, cut_entries = self._pending.cut()
            segments += cut
            entries += cut_entries
            self._is_ended = self._is_stopped = True
        return OutputStep(observation, tuple(self._parse(segments)), result.matched, self._hand_on(entries),
                          num_output_tokens=self._num_tokens)

    def _stop_ahead_text(self) -> str:
        """The text the detokenizer holds (an open character at its end) that no later id changes,
        where a string stop completes in it, else "": the stop then takes effect on this token, as
        it would had that text been shown, not once the open character completes (which a run of
        stray bytes puts off without bound). A stop ending in U+FFFD completes at a held U+FFFD only
        once the detokenizer finds it a stray byte, not an open character. Each held character is
        looked at once (`StringStopMatcher.look_ahead` keeps the characters a stop can still need)."""
        detokenizer, stops = self._detokenizer, self._string_stops
        ahead = detokenizer.fixed_open_text(self._num_looked_ahead)
        self._num_looked_ahead += len(ahead)
        if stops.look_ahead(ahead):
            return detokenizer.fixed_open_text()
        if not stops.can_end_in_replacement:
            return ""
        # the U+FFFD after the text looked at (and a space the cleanup held before it)
        stray = detokenizer.fixed_open_text(self._num_looked_ahead, REPLACEMENT_CHAR)
        if stops.completes_ahead(stray) and detokenizer.ends_in_stray_byte():
            return detokenizer.fixed_open_text(0, REPLACEMENT_CHAR)
        return ""

    def _feed_token_stops(self, observation: TokenObservation | None, token_id: int,
                          logprobs: TokenLogprobs | None) -> OutputStep:
        """Token stops: ids are detokenized once the matcher releases them, and a match flushes the
        text of the ids before it (a delta can hold text of earlier ids, which the stop must not hide)."""
        self._held.append((token_id, logprobs))
        num_released, matched = self._token_stops.advance(token_id)
        segments, entries = self._detokenize_held(num_released)
        if matched:
            self._held.clear()
            segments.append((NOT_A_TOKEN, self._detokenizer.finish()))
            self._is_ended = self._is_stopped = True
        return OutputStep(observation, tuple(self._parse(segments)), matched, self._hand_on(entries),
                          num_output_tokens=self._num_tokens)

    def _detokenize_held(self, count: int) -> tuple[list[Segment], list[LogprobEntry]]:
        """Detokenizes the first `count` held ids, each with its log-probability entry."""
        segments, entries = [], []
        for _ in range(count):
            held_id, held_logprobs = self._held.popleft()
            text = self._detokenizer.feed(held_id)
            entries.extend(self._logprob_entry(held_id, held_logprobs))
            segments.append((held_id, text))
        return segments, entries

    def _logprob_entry(self, token_id: int, logprobs: TokenLogprobs | None) -> tuple[LogprobEntry, ...]:
        """The token's entry, with the text its detokenization just gave, before the space cleanup, and
        the characters the cleanup removes before it (`LogprobEntry.shown`, `removed`)."""
        if self._token_texts is None or logprobs is None:
            return ()
        detokenizer = self._detokenizer
        settled = detokenizer.num_pending_tokens == 0
        entry = self._token_texts.entry(token_id, logprobs, shown=detokenizer.uncleaned_delta, settled=settled,
                                        removed=detokenizer.num_removed)
        if detokenizer.cleans_spaces:
            self._entry_starts.append((entry, detokenizer.delta_start))
        return (entry,)

    def _hand_on(self, entries: Sequence[LogprobEntry], is_end: bool = False) -> tuple[LogprobEntry, ...]:
        """The entries to hand on now: `entries` (the next ones, in order) after those held before
        them, up to the first whose `removed` the space cleanup has not decided. The text after a
        held space decides whether the cleanup removes it (" 's" reads "'s"), and with it where every
        later token starts in the cleaned text: an entry handed on before that (on a chunk of its
        own) counted the space, its ``text_offset`` one past its text. Each is handed on with the
        final count; at the end (`is_end`) all are, those not decided (text past a stop the cleanup
        still holds) with the count as known when they were made."""
        if not self._detokenizer.cleans_spaces:
            self._logprobs.extend(entries)
            return tuple(entries)
        self._undecided.extend(entries)
        out = []
        while self._undecided:
            entry = self._undecided[0]
            while self._entry_starts[0][0] is not entry:  # entries a stop dropped
                self._entry_starts.popleft()
            removed = self._detokenizer.removed_before(self._entry_starts[0][1])
            if removed is None and not is_end:
                break
            self._undecided.popleft()
            self._entry_starts.popleft()
            is_kept = removed is None or removed == entry.removed
            out.append(entry if is_kept else dataclasses.replace(entry, removed=removed))
        self._logprobs.extend(out)
        return tuple(out)

    def finish(self, reason: FinishReason, reused_prompt_tokens: int = 0) -> OutputFinal:
        """Ends the output with the engine's reason (a matched stop makes it STOP) and flushes."""
        if self._is_finished:
            raise ValueError("finish called twice")
        self._is_finished = True
        segments = [] if self._is_stopped else self._flush()
        self._hand_on((), is_end=True)
        events = self._parse(segments) + self._pipeline.finish()
        if self._is_stopped and reason not in (FinishReason.ERROR, FinishReason.REJECTED):
            reason = FinishReason.STOP
        usage = Usage(len(self._prompt_token_ids), self._num_tokens, reused_prompt_tokens,
                      self._pipeline.num_reasoning_tokens)
        logprobs = tuple(self._logprobs) if self._token_texts is not None else None
        prompt = tuple(self._prompt_entries) if self._prompt_entries is not None else None
        return OutputFinal(tuple(events), reason, usage, self._pipeline.result(), self._record(reused_prompt_tokens),
                           logprobs, prompt)

    def _flush(self) -> list[Segment]:
        """Held text at EOS or the output limit; a stop may still complete in the detokenizer's tail."""
        if self._token_stops is not None:  # no stop matched: the held ids' text, then the tail
            segments, entries = self._detokenize_held(len(self._held))
            self._hand_on(entries)
            return segments + [(NOT_A_TOKEN, self._detokenizer.finish())]
        tail = self._detokenizer.finish()
        if self._stops is None:
            return [(NOT_A_TOKEN, tail)]
        self._pending.push(NOT_A_TOKEN, tail, (), self._detokenizer.num_carried)
        segments, entries = self._pending.release(len(self._stops.finish(tail)))
        if self._pending.has_text:  # the stop completed in the tail
            cut, cut_entries = self._pending.cut()
            segments += cut
            entries += cut_entries
            self._is_stopped = True
        else:
            rest, rest_entries = self._pending.release_all()
            segments += rest
            entries += rest_entries
        self._hand_on(entries)
        return segments

    def _parse(self, segments: list[Segment]) -> list[Event]:
        events: list[Event] = []
        for token_id, text in segments:
            if text or token_id != NOT_A_TOKEN:  # a token without text yet still counts (reasoning tokens)
                events.extend(self._pipeline.feed(token_id, text))
        return events

    def _observe(self, token_id: int, observed_ns: int | None) -> TokenObservation | None:
        if not self._observation.is_observed:
            return None
        self._token_ids.append(token_id)
        if not self._observation.is_timed:
            return TokenObservation(token_id, None)
        if observed_ns is None:
            raise ValueError("a timed request needs each token's completion timestamp")
        self._timestamps_ns.append(observed_ns)
        return TokenObservation(token_id, observed_ns)

    def _record(self, reused_prompt_tokens: int) -> ObservationRecord | None:
        if not self._observation.is_observed:
            return None
        return observation_record(
            self._observation.is_timed, self._prompt_token_ids, self._token_ids, self._timestamps_ns,
            (self._ingress_ns, self._enqueue_ns), reused_prompt_tokens,
        )

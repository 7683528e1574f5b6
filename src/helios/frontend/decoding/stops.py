"""User stops: string stops on decoded text and token stops on sampled ids.

Validation (`parse_stop_options`) runs during request preparation and raises `StopOptionError`
(HTTP 400). Each request that has stops gets one matcher from `StopOptions.new_matcher()`, owned by
the request's output pipeline and fed in generation order:

    result = matcher.feed(token_id, text)   # text: the detokenizer's delta for this token
    ... present result.emit_text; if result.matched the request finishes with reason "stop"
    tail = matcher.finish(detokenizer.finish())   # EOS or output limit: flush what was held back

String stops match the decoded text before presentation, including reasoning and tool envelopes, so
`text` must be the raw delta (envelope markup included). The detokenizer already holds back partial
UTF-8 characters; the matcher holds back any suffix that could still grow into a stop. The text the
detokenizer holds that no later id changes can be matched before it is fed (`look_ahead`), so a
stop takes effect on the token whose text completes it. The first completed match (the one ending
earliest; of those, the longest) removes the stop string and every character after it, also within
the same sampled token. Token stops hold back ids that form a proper
prefix of a stop sequence and omit matched ids from presentation. Usage and raw-token observation
still count every fed token, including the one that crossed or formed the stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

from helios.errors import RequestError
from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR
from helios.frontend.decoding.text_bounds import is_unicode_text

MAX_STOP_STRINGS = 4
MAX_STOP_STRING_BYTES = 4096
MAX_STOP_TOKEN_SEQUENCES = 16
MAX_STOP_TOKEN_SEQUENCE_LEN = 64


class StopOptionError(RequestError):
    """`stop`, `stop_token_ids` or `stop_token_sequences` is malformed or not combinable; `param`
    names the field at fault (the error body's ``param``)."""


class StopResult(NamedTuple):
    """What one fed token releases: text safe to present, and whether a stop completed."""

    emit_text: str
    matched: bool


class StopMatcher(Protocol):
    """One request's incremental stop matcher; not thread-safe, not reusable after a match."""

    def feed(self, token_id: int, text: str) -> StopResult: ...

    def finish(self, final_text: str = "") -> str: ...


@dataclass(frozen=True)
class StopOptions:
    """Validated stops of one request. String stops and token stops never coexist."""

    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    token_sequences: tuple[tuple[int, ...], ...] = ()

    @property
    def has_string_stops(self) -> bool:
        return bool(self.strings)

    @property
    def has_token_stops(self) -> bool:
        return bool(self.token_ids or self.token_sequences)

    def new_matcher(self) -> StopMatcher | None:
        """A fresh matcher for one generation, or None when the request has no stops."""
        if self.strings:
            return StringStopMatcher(self.strings)
        if self.has_token_stops:
            singles = tuple((token_id,) for token_id in self.token_ids)
            return TokenStopMatcher(singles + self.token_sequences)
        return None


def parse_stop_options(
    stop: object,
    stop_token_ids: object = None,
    stop_token_sequences: object = None,
    *,
    vocab_size: int,
    has_structured_output: bool = False,
) -> StopOptions:
    """Validates the request's stop fields (JSON values) against the sampled vocabulary size."""
    strings = _parse_stop_strings(stop)
    token_ids = _parse_token_ids("stop_token_ids", stop_token_ids, vocab_size)
    sequences = _parse_token_sequences(stop_token_sequences, vocab_size)
    if strings and (token_ids or sequences):
        raise StopOptionError("stop strings cannot be combined with stop_token_ids or stop_token_sequences", "stop")
    if len(token_ids) + len(sequences) > MAX_STOP_TOKEN_SEQUENCES:  # each id is matched as a sequence
        field = "stop_token_sequences" if sequences else "stop_token_ids"  # the one that goes past the bound
        raise StopOptionError(f"stop_token_ids and stop_token_sequences together accept at most "
                              f"{MAX_STOP_TOKEN_SEQUENCES} stops", field)
    if strings and has_structured_output:
        raise StopOptionError("stop strings cannot be combined with structured output", "stop")
    return StopOptions(strings, token_ids, sequences)


def _parse_stop_strings(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list):
        raise StopOptionError("stop must be null, a string or an array of strings", "stop")
    if len(items) > MAX_STOP_STRINGS:
        raise StopOptionError(f"stop accepts at most {MAX_STOP_STRINGS} strings", "stop")
    if not all(isinstance(item, str) and item for item in items):
        raise StopOptionError("every stop must be a non-empty string", "stop")
    if not all(is_unicode_text(item) for item in items):
        raise StopOptionError("every stop must be valid Unicode text (no lone surrogates)", "stop")
    if sum(len(item.encode("utf-8")) for item in items) > MAX_STOP_STRING_BYTES:
        raise StopOptionError(f"stop strings total more than {MAX_STOP_STRING_BYTES} UTF-8 bytes", "stop")
    return tuple(items)


def _parse_token_ids(field: str, value: object, vocab_size: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise StopOptionError(f"{field} must be null or an array of token ids", field)
    for token_id in value:
        if type(token_id) is not int or not 0 <= token_id < vocab_size:
            raise StopOptionError(f"{field} entries must be token ids in [0, {vocab_size})", field)
    return tuple(value)


def _parse_token_sequences(value: object, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise StopOptionError("stop_token_sequences must be null or an array of id arrays", "stop_token_sequences")
    if len(value) > MAX_STOP_TOKEN_SEQUENCES:
        raise StopOptionError(f"stop_token_sequences accepts at most {MAX_STOP_TOKEN_SEQUENCES} sequences",
                              "stop_token_sequences")
    sequences = []
    for sequence in value:
        ids = _parse_token_ids("stop_token_sequences", sequence, vocab_size)
        if not 1 <= len(ids) <= MAX_STOP_TOKEN_SEQUENCE_LEN:
            raise StopOptionError(f"each stop token sequence holds 1 to {MAX_STOP_TOKEN_SEQUENCE_LEN} ids",
                                  "stop_token_sequences")
        sequences.append(ids)
    return tuple(sequences)


class StringStopMatcher:
    """Matches stop strings on incremental text; holds back at most the longest stop minus one char."""

    def __init__(self, stops: Sequence[str]):
        if not stops or not all(stops):
            raise ValueError("string stops must be non-empty")
        self._stops = tuple(stops)
        self._max_len = max(len(stop) for stop in self._stops)
        self._held = ""
        self._ahead = ""  # the held text and the text looked ahead at since, its last max_len - 1 characters
        # a stop may end in U+FFFD, which the detokenizer's pending text ends with until it is known
        self.can_end_in_replacement = any(stop.endswith(REPLACEMENT_CHAR) for stop in self._stops)
        self._done = False

    @property
    def held_text(self) -> str:
        """Text received but not yet released because a stop could still complete in it."""
        return self._held

    def feed(self, token_id: int, text: str) -> StopResult:
        if self._done:
            raise ValueError("feed after a stop or finish")
        buffer = self._held + text
        start = _first_completed_match(buffer, self._stops)
        if start is not None:
            self._done, self._held = True, ""
            return StopResult(buffer[:start], True)
        keep = _live_prefix_start(buffer, self._stops, self._max_len)
        self._held = buffer[keep:]
        if text:
            self._ahead = self._held
        return StopResult(buffer[:keep], False)

    def look_ahead(self, text: str) -> bool:
        """Whether a stop completes in the held text followed by every `text` looked ahead at since
        the last feed of text: text known to come next but not fed yet (the fixed part of the
        detokenizer's pending text), each part given once, in order. Keeps only the characters a
        stop can still need, so each character is scanned a bounded number of times."""
        if self._done or not text:
            return False
        window = self._ahead + text
        if _first_completed_match(window, self._stops) is not None:
            return True
        self._ahead = window[max(0, len(window) - self._max_len + 1):] if self._max_len > 1 else ""
        return False

    def completes_ahead(self, text: str) -> bool:
        """Whether a stop would complete were `text` to follow what was looked ahead at (not kept)."""
        return not self._done and _first_completed_match(self._ahead + text, self._stops) is not None

    def finish(self, final_text: str = "") -> str:
        """EOS or output limit: matches `final_text` (the detokenizer's flushed tail) like a feed,
        then releases everything held. Returns "" after an earlier match."""
        if self._done:
            return ""
        result = self.feed(-1, final_text)
        held, self._held, self._done = self._held, "", True
        return result.emit_text if result.matched else result.emit_text + held


def _first_completed_match(buffer: str, stops: tuple[str, ...]) -> int | None:
    """Start of the match that ends first (ties: the longest), or None."""
    best: tuple[int, int] | None = None
    for stop in stops:
        start = buffer.find(stop)
        if start >= 0:
            key = (start + len(stop), start)
            best = key if best is None or key < best else best
    return None if best is None else best[1]


def _live_prefix_start(buffer: str, stops: tuple[str, ...], max_len: int) -> int:
    """Smallest index whose suffix is a proper prefix of some stop; len(buffer) if none."""
    for start in range(max(0, len(buffer) - max_len + 1), len(buffer)):
        tail = buffer[start:]
        if any(stop.startswith(tail) for stop in stops):
            return start
    return len(buffer)


class TokenStopMatcher:
    """Matches stop id sequences (single stop ids are sequences of one) on sampled ids.

    Pending entries pair each held id with its text; text of ids that can no longer begin a match
    is released in order, text of matched ids is dropped. `advance` is the same matching on ids
    alone, for a caller that holds ids back before detokenizing them (the output path: a token's
    delta can hold text of ids before it, which a stop must not hide).
    """

    def __init__(self, sequences: Sequence[Sequence[int]]):
        if not sequences or not all(sequences):
            raise ValueError("token stop sequences must be non-empty")
        self._sequences = sorted({tuple(seq) for seq in sequences}, key=len, reverse=True)
        self._pending: list[tuple[int, str]] = []
        self._done = False

    @property
    def num_held_tokens(self) -> int:
        return len(self._pending)

    def advance(self, token_id: int) -> tuple[int, bool]:
        """Adds one id; returns how many held ids (oldest first, this one included) are released
        and whether a stop matched, in which case every id still held is dropped."""
        num_released, matched = self._match(token_id, "")
        self._release(num_released)
        return num_released, matched

    def feed(self, token_id: int, text: str) -> StopResult:
        num_released, matched = self._match(token_id, text)
        return StopResult(self._release(num_released), matched)

    def _match(self, token_id: int, text: str) -> tuple[int, bool]:
        if self._done:
            raise ValueError("feed after a stop or finish")
        self._pending.append((token_id, text))
        ids = tuple(pending_id for pending_id, _ in self._pending)
        for sequence in self._sequences:  # longest first: a tie at this token omits the most
            if ids[len(ids) - len(sequence) :] == sequence:
                self._done = True
                return len(ids) - len(sequence), True
        keep = next(
            (start for start in range(len(ids)) if any(seq[: len(ids) - start] == ids[start:] for seq in self._sequences)),
            len(ids),
        )
        return keep, False

    def finish(self, final_text: str = "") -> str:
        """EOS or output limit: releases held tokens' text, then `final_text` (the detokenizer's
        flushed tail). Returns "" after an earlier match."""
        if self._done:
            return ""
        emit = self._release(len(self._pending))
        self._done = True
        return emit + final_text

    def _release(self, count: int) -> str:
        released, self._pending = self._pending[:count], self._pending[count:]
        if self._done:
            self._pending = []
        return "".join(text for _, text in released)

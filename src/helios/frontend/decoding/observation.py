"""Token and timing observation: `return_token_ids`, `return_token_timestamps`, `performance`.

Clock discipline: one `ObservationClock` per process, created at runtime startup, is the origin of
every observed nanosecond. Only timed requests (return_token_timestamps=true) read it: ingress and
enqueue are stamped through `stamp_*` helpers that return None without reading the clock for
untimed requests, and a `RequestObserver` exists only for observed requests (`start` returns None
otherwise), reading the clock once per validated completion and only when timed.

Placement (who calls what):
- chat handler, right after HTTP JSON decoding: ``ingress_ns = stamp_ingress(options, clock)``;
- just before submitting the prepared request to the model queue: ``observer.mark_enqueue()``;
- model worker, immediately after ``scheduler.complete`` validated the request's tokens and before
  grammar advance, stops or parsing: ``events = observer.observe(token_ids)``;
- terminal response: ``record = observer.finish(reused_prompt_tokens)``.

A `RequestObserver` is owned by the request's output path and used by one thread at a time. The
records it returns are immutable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from helios.errors import RequestError


class ObservationOptionError(RequestError):
    """An observation flag that is not a boolean or null, or timestamps without token ids; `param`
    names the field (the error body's ``param``)."""


class ObservationClock:
    """Process-local monotonic nanoseconds since runtime startup. Immutable after construction."""

    def __init__(self, read_ns: Callable[[], int] = time.monotonic_ns):
        self._read_ns = read_ns
        self.origin_ns = read_ns()

    def now_ns(self) -> int:
        return self._read_ns() - self.origin_ns


def parse_optional_bool(name: str, value: object) -> bool:
    """Booleans or null only; null means false (also used for stream_options.include_usage)."""
    if value is None:
        return False
    if type(value) is not bool:
        raise ObservationOptionError(f"{name} must be a boolean or null", name)
    return value


@dataclass(frozen=True)
class ObservationOptions:
    """Validated observation flags of one request."""

    return_token_ids: bool = False
    return_token_timestamps: bool = False

    def __post_init__(self):
        if self.return_token_timestamps and not self.return_token_ids:
            raise ObservationOptionError("return_token_timestamps requires return_token_ids=true",
                                         "return_token_timestamps")

    @classmethod
    def parse(cls, return_token_ids: object, return_token_timestamps: object) -> ObservationOptions:
        return cls(
            parse_optional_bool("return_token_ids", return_token_ids),
            parse_optional_bool("return_token_timestamps", return_token_timestamps),
        )

    @property
    def is_observed(self) -> bool:
        return self.return_token_ids

    @property
    def is_timed(self) -> bool:
        return self.return_token_timestamps


def stamp_ingress(options: ObservationOptions, clock: ObservationClock) -> int | None:
    """Chat-handler entry time for timed requests; None (and no clock read) otherwise."""
    return clock.now_ns() if options.is_timed else None


class TokenObservation(NamedTuple):
    """One generated id as observed; `timestamp_ns` is None for untimed requests."""

    token_id: int
    timestamp_ns: int | None


@dataclass(frozen=True)
class Performance:
    """The top-level `performance` object of a timed response (token-timestamp origin)."""

    ingress_ns: int
    enqueue_ns: int
    reused_prompt_tokens: int


@dataclass(frozen=True)
class ObservationRecord:
    """What an observed terminal response reports.

    `token_ids` are the raw generated ids, EOS and stop-hidden tokens included;
    `token_timestamps_ns` is aligned with them for timed requests and None otherwise, as is
    `performance`.
    """

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    token_timestamps_ns: tuple[int, ...] | None
    reused_prompt_tokens: int
    performance: Performance | None


class RequestObserver:
    """Records one observed request's generated ids (and completion times when timed)."""

    def __init__(
        self,
        options: ObservationOptions,
        clock: ObservationClock,
        prompt_token_ids: Sequence[int],
        ingress_ns: int | None,
    ):
        if not options.is_observed:
            raise ValueError("RequestObserver is only for observed requests; use RequestObserver.start")
        if options.is_timed and ingress_ns is None:
            raise ValueError("a timed request needs its ingress timestamp")
        self._options = options
        self._clock = clock
        self._prompt_token_ids = tuple(prompt_token_ids)
        self._ingress_ns = ingress_ns
        self._enqueue_ns: int | None = None
        self._token_ids: list[int] = []
        self._timestamps_ns: list[int] = []

    @classmethod
    def start(
        cls,
        options: ObservationOptions,
        clock: ObservationClock,
        prompt_token_ids: Sequence[int],
        ingress_ns: int | None,
    ) -> RequestObserver | None:
        """An observer for an observed request, None for an unobserved one."""
        return cls(options, clock, prompt_token_ids, ingress_ns) if options.is_observed else None

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """Sent once, at the head of the response (first SSE chunk or top-level JSON field)."""
        return self._prompt_token_ids

    def mark_enqueue(self) -> None:
        """Stamps the enqueue time (timed requests only); call once, just before model submission."""
        if self._options.is_timed:
            if self._enqueue_ns is not None:
                raise ValueError("enqueue already stamped")
            self._enqueue_ns = self._clock.now_ns()

    def observe(self, token_ids: Sequence[int]) -> tuple[TokenObservation, ...]:
        """Records one validated completion's ids; all of them share one clock read when timed."""
        if not token_ids:
            return ()
        timestamp_ns = self._clock.now_ns() if self._options.is_timed else None
        self._token_ids.extend(token_ids)
        if timestamp_ns is not None:
            self._timestamps_ns.extend([timestamp_ns] * len(token_ids))
        return tuple(TokenObservation(token_id, timestamp_ns) for token_id in token_ids)

    def finish(self, reused_prompt_tokens: int) -> ObservationRecord:
        """The terminal record; reads no clock."""
        return observation_record(
            self._options.is_timed, self._prompt_token_ids, self._token_ids, self._timestamps_ns,
            (self._ingress_ns, self._enqueue_ns), reused_prompt_tokens,
        )


def observation_record(is_timed: bool, prompt_token_ids, token_ids, timestamps_ns, stamps: tuple,
                       reused_prompt_tokens: int) -> ObservationRecord:
    """The terminal record of an observed request; `stamps` is (ingress_ns, enqueue_ns). Reads no clock."""
    performance = None
    if is_timed:
        ingress_ns, enqueue_ns = stamps
        if enqueue_ns is None:
            raise ValueError("a timed request finished without an enqueue timestamp")
        performance = Performance(ingress_ns, enqueue_ns, reused_prompt_tokens)
    return ObservationRecord(
        prompt_token_ids=tuple(prompt_token_ids),
        token_ids=tuple(token_ids),
        token_timestamps_ns=tuple(timestamps_ns) if is_timed else None,
        reused_prompt_tokens=reused_prompt_tokens,
        performance=performance,
    )

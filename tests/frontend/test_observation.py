"""Observation records, flag validation, and the rule that unobserved requests read no clock."""

from __future__ import annotations

import pytest

from helios.errors import RequestError
from helios.frontend.decoding.observation import (
    ObservationClock,
    ObservationOptionError,
    ObservationOptions,
    Performance,
    RequestObserver,
    TokenObservation,
    parse_optional_bool,
    stamp_ingress,
)


class FakeClock:
    """A monotonic ns source that counts its reads and advances 10 ns per read."""

    def __init__(self, start: int = 1_000):
        self.value = start
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        self.value += 10
        return self.value


@pytest.fixture
def fake():
    return FakeClock()


@pytest.fixture
def clock(fake):
    return ObservationClock(fake)


def test_clock_origin_is_read_once_at_startup(fake, clock):
    assert fake.reads == 1 and clock.origin_ns == 1_010
    assert clock.now_ns() == 10
    assert clock.now_ns() == 20


def test_default_clock_is_monotonic_from_zero():
    clock = ObservationClock()
    first, second = clock.now_ns(), clock.now_ns()
    assert 0 <= first <= second


@pytest.mark.parametrize(
    "ids, stamps, expected",
    [
        (None, None, ObservationOptions(False, False)),
        (False, None, ObservationOptions(False, False)),
        (True, None, ObservationOptions(True, False)),
        (True, False, ObservationOptions(True, False)),
        (True, True, ObservationOptions(True, True)),
    ],
)
def test_flags_accept_booleans_and_null(ids, stamps, expected):
    assert ObservationOptions.parse(ids, stamps) == expected


@pytest.mark.parametrize("ids, stamps", [(1, None), ("true", None), (True, 0), (True, "yes"), (None, True), (False, True)])
def test_invalid_flags_are_request_errors(ids, stamps):
    with pytest.raises(ObservationOptionError) as info:
        ObservationOptions.parse(ids, stamps)
    assert isinstance(info.value, RequestError)


def test_parse_optional_bool_for_include_usage():
    assert parse_optional_bool("stream_options.include_usage", None) is False
    assert parse_optional_bool("stream_options.include_usage", True) is True
    with pytest.raises(ObservationOptionError, match="include_usage"):
        parse_optional_bool("stream_options.include_usage", 1)


def test_unobserved_request_reads_no_clock(fake, clock):
    options = ObservationOptions()
    reads = fake.reads
    assert stamp_ingress(options, clock) is None
    assert RequestObserver.start(options, clock, [1, 2], None) is None
    assert fake.reads == reads


def test_ids_only_observation_reads_no_clock(fake, clock):
    options = ObservationOptions(return_token_ids=True)
    reads = fake.reads
    observer = RequestObserver.start(options, clock, [1, 2, 3], stamp_ingress(options, clock))
    observer.mark_enqueue()
    assert observer.observe([7]) == (TokenObservation(7, None),)
    assert observer.observe([8, 2]) == (TokenObservation(8, None), TokenObservation(2, None))
    record = observer.finish(reused_prompt_tokens=2)
    assert fake.reads == reads
    assert record.prompt_token_ids == (1, 2, 3)
    assert record.token_ids == (7, 8, 2)
    assert record.token_timestamps_ns is None and record.performance is None
    assert record.reused_prompt_tokens == 2


def test_timed_observation_stamps_each_completion_once(fake, clock):
    options = ObservationOptions(True, True)
    ingress = stamp_ingress(options, clock)
    observer = RequestObserver.start(options, clock, [5], ingress)
    observer.mark_enqueue()
    reads = fake.reads
    first = observer.observe([10])
    second = observer.observe([11, 12, 2])  # one speculative completion of three tokens, EOS included
    assert observer.observe([]) == ()
    assert fake.reads == reads + 2
    record = observer.finish(reused_prompt_tokens=0)
    assert fake.reads == reads + 2
    assert record.token_ids == (10, 11, 12, 2)
    assert record.token_timestamps_ns == (first[0].timestamp_ns,) + (second[0].timestamp_ns,) * 3
    assert ingress < record.performance.enqueue_ns < first[0].timestamp_ns < second[0].timestamp_ns
    assert record.performance == Performance(ingress, record.performance.enqueue_ns, 0)


def test_timed_observer_needs_ingress_and_single_enqueue(clock):
    options = ObservationOptions(True, True)
    with pytest.raises(ValueError):
        RequestObserver(options, clock, [], None)
    observer = RequestObserver(options, clock, [], 0)
    with pytest.raises(ValueError):
        observer.finish(0)
    observer.mark_enqueue()
    with pytest.raises(ValueError):
        observer.mark_enqueue()
    with pytest.raises(ValueError):
        RequestObserver(ObservationOptions(), clock, [], None)

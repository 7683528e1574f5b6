"""`EngineLink`'s reading of the engine process's beats: when the model worker counts as stalled
(requests pending and its round count unchanged for more than the liveness timeout, as the beats
showed it) and when not. Beats are handed to the link with the times they arrived at, so no test
waits (tests/e2e/test_engine_stalls.py runs the same through an engine process and the app)."""

from __future__ import annotations

import time

from helios.runtime.engine_link import UNRESPONSIVE_GRACE_S, Beat, EngineLink

TIMEOUT_S = 10.0


class _Process:
    """An engine process that ended as soon as it was asked to (records the waits for it)."""

    def __init__(self):
        self.joins: list[float | None] = []

    def join(self, timeout=None) -> None:
        self.joins.append(timeout)

    def is_alive(self) -> bool:
        return False

    def kill(self) -> None:
        raise AssertionError("the engine process ended by itself")


class _Pipe:
    def __init__(self):
        self.sent: list = []

    def send(self, message) -> None:
        self.sent.append(message)

    def close(self) -> None:
        pass


def link_after(*beats: tuple[float, int, bool]) -> EngineLink:
    """A link that took `beats` ((seconds before now, progress, has_pending), oldest first)."""
    link = EngineLink(_Pipe(), _Process(), liveness_timeout_s=TIMEOUT_S)
    now = time.monotonic()
    for ago, progress, has_pending in beats:
        link._beat(Beat(progress, has_pending), now - ago)
    return link


def test_requests_pending_and_no_round_completed_for_longer_than_the_timeout_is_a_stall():
    link = link_after((12, 7, True), (6, 7, True), (0, 7, True))
    assert link.unresponsive_reason is None  # the command loop beats
    reason = link.stalled_reason
    assert reason is not None and "completed no step for 12.0 s" in reason and "more than 10 s" in reason


def test_a_count_unchanged_for_the_timeout_or_less_is_no_stall():
    assert link_after((10, 7, True), (0, 7, True)).stalled_reason is None
    assert link_after((30, 7, True), (12, 7, True), (5, 8, True), (0, 8, True)).stalled_reason is None


def test_the_first_beat_whose_count_moved_ends_a_stall():
    link = link_after((30, 7, True), (0, 7, True))
    assert link.stalled_reason is not None
    link._beat(Beat(8, True), time.monotonic())
    assert link.stalled_reason is None


def test_an_idle_engine_is_never_stalled_however_long_its_count_stands_still():
    assert link_after((300, 7, False), (150, 7, False), (0, 7, False)).stalled_reason is None
    # work arriving after a long idle spell: its time counts from the first beat that shows it
    link = link_after((300, 7, False), (5, 7, False), (4, 7, True), (0, 7, True))
    assert link.stalled_reason is None
    link = link_after((300, 7, True), (100, 7, False), (0, 7, True))  # finished, then new work
    assert link.stalled_reason is None


def test_the_stall_clock_is_what_the_beats_showed_never_the_time_since_the_latest_one():
    """Between beats (a grammar compile on the command loop holds them back) nothing is known about
    the worker: the count stood still for 3 s of beats, and 12 s have passed since the first of
    them, but the latest beat is 9 s old (less than the timeout: not unresponsive either)."""
    link = link_after((12, 7, True), (9, 7, True))
    assert link.unresponsive_reason is None and link.stalled_reason is None


def test_a_stalled_engine_process_gets_the_short_shutdown_grace():
    """Before: `shutdown` waited its whole deadline for an engine process whose worker would not
    finish its round (its own `Engine.shutdown` waits on that worker)."""
    stalled = link_after((30, 7, True), (0, 7, True))
    stalled.shutdown(timeout=30.0)
    assert stalled._process.joins == [UNRESPONSIVE_GRACE_S]
    assert [type(m).__name__ for m in stalled._connection.sent] == ["Shutdown"]
    serving = link_after((30, 7, True), (0, 9, True))
    serving.shutdown(timeout=30.0)
    assert serving._process.joins == [30.0]
    assert serving.stalled_reason is None  # shut down: no longer reported


def test_a_request_that_crossed_the_shutdown_ends_cancelled_as_shut_down_not_died():
    """An `Admit` written after the engine process took its `Shutdown` is never read: the reader
    ends it at the process's end, CANCELLED, with the message of a death ("the model worker died")."""
    from helios.runtime.engine import EngineRequest
    from helios.runtime.engine_link import SHUT_DOWN, Shutdown
    from helios.runtime.records.events import FinishReason
    from helios.runtime.records.request import RequestSpec

    class Ended(_Pipe):
        def recv(self):
            return Shutdown()  # the engine process's last message

    link = EngineLink(Ended(), _Process(), liveness_timeout_s=TIMEOUT_S)
    batches = []
    link.connect(batches.append)
    link.submit(EngineRequest(RequestSpec("crossed", (1, 2, 3), 4)))
    link.start()
    link._reader.join(5.0)
    finishes = [(e.request_id, e.reason, e.message) for b in batches for e in b.events]
    assert finishes == [("crossed", FinishReason.CANCELLED, SHUT_DOWN)]
    assert link.is_healthy and link.failure is None

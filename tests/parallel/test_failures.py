"""A rank that dies or stops answering fails the model cleanly: requests in flight end with an
execution error, the engine reports itself unhealthy, later requests fail at once, nothing hangs.
Startup with a missing or mismatched rank fails with a typed LoadError on rank zero (and on the
refusing rank)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest

from helios.abi.collectives import CollectiveError
from helios.errors import LoadError
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_peers import PeerKind, join_rank
from helios.runtime.parallel.rank_rendezvous import MissingRankError, RankJoinError, Rendezvous
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import LLAMA3, QWEN3_MOE
from support.sweeps import swept

from .conftest import FAST, MAX_TOKENS, PROMPTS, running
from .test_generate_cli import free_port

HANG_GUARD_S = 120  # a broken model must answer long before this; reaching it means a hang
# A 10 s timeout: a stopped rank is found after it, and at 3 s a loaded 2-core CI machine once held
# rank zero's first step past it, so the group broke before the first token.
PROCESSES = replace(FAST, peers=PeerKind.PROCESSES, collective_timeout_s=10.0)


class Requests:
    """Submits long requests and records their events (called in the model worker thread)."""

    def __init__(self, engine, count: int, max_tokens: int = 55):
        self.first_token = threading.Event()
        self.all_done = threading.Event()
        self.finished: dict[str, FinishEvent] = {}
        self._lock = threading.Lock()
        self._count = count
        for index in range(count):
            prompt = (5 + index, 6, 7)
            spec = RequestSpec(f"r{index}", prompt, max_tokens, frozenset())
            engine.submit(EngineRequest(spec, self.record))

    def record(self, event) -> None:
        if isinstance(event, TokenEvent):
            self.first_token.set()
            return
        with self._lock:
            self.finished[event.request_id] = event
            if len(self.finished) == self._count:
                self.all_done.set()
                self.first_token.set()  # a waiter for the first token need not wait out its guard

    def messages(self) -> list[str]:
        with self._lock:
            return [event.message for event in self.finished.values()]

    def unfinished(self) -> set[str]:
        with self._lock:
            return {f"r{i}" for i in range(self._count)} - set(self.finished)


def lose_a_rank_mid_generation(runtime, how: int) -> Requests:
    """Starts 3 requests, sends `how` to the local rank-1 process after the first token, checks
    that every request still in flight ends with an error and the engine turns unhealthy, and
    returns the requests."""
    engine = runtime.engine
    engine.start()
    requests = Requests(engine, 3)
    assert requests.first_token.wait(HANG_GUARD_S)
    in_flight = requests.unfinished()
    assert in_flight, f"every request finished before the rank was lost: {requests.messages()}"
    (pid,) = runtime.peers.local_pids
    os.kill(pid, how)
    try:
        assert requests.all_done.wait(HANG_GUARD_S)
    finally:
        with contextlib.suppress(ProcessLookupError):  # already reaped when the model failed
            os.kill(pid, signal.SIGKILL)  # a stopped rank would otherwise outlive the test
    assert {requests.finished[r].reason for r in in_flight} == {FinishReason.ERROR}
    assert not engine.is_healthy
    return requests


def a_late_request_fails(engine) -> None:
    """After a lost rank: the engine reports itself unhealthy and a new request ends with an error at once."""
    assert not engine.stats.snapshot().healthy
    late = Requests(engine, 1)
    assert late.all_done.wait(HANG_GUARD_S)
    assert late.finished["r0"].reason is FinishReason.ERROR
    assert "tensor-parallel model failed" in late.finished["r0"].message


def test_a_rank_that_stops_answering_ends_requests_in_flight_with_errors(cores):
    """Rank 1 (a thread) stops answering after the first token: it no longer runs rank zero's plans, so rank
    zero's next collective waits out the collective timeout (FAST's 5 s) and the model fails as for a stopped
    rank process (the sweep's stops-answering case below: SIGSTOP under a 10 s timeout)."""
    with running(cores.open(cores.core(QWEN3_MOE, 2))) as runtime:
        release = threading.Event()

        def silent(*args, **kwargs):
            release.wait(HANG_GUARD_S)  # answers nothing until the test is done with the group,
            raise CollectiveError("rank 1 stopped answering")  # then ends the rank thread at once

        engine = runtime.engine
        engine.start()
        requests = Requests(engine, 3)
        try:
            assert requests.first_token.wait(HANG_GUARD_S)
            in_flight = requests.unfinished()
            assert in_flight, f"every request finished before the rank stopped: {requests.messages()}"
            (executor,) = runtime.peers.peer_executors  # (set once the thread serves)
            executor.run = executor.launch = executor.finish = silent
            assert requests.all_done.wait(HANG_GUARD_S)
            assert {requests.finished[r].reason for r in in_flight} == {FinishReason.ERROR}
            assert not engine.is_healthy
            a_late_request_fails(engine)
        finally:
            release.set()


# A rank process stopped (one frame in flight) or killed only with HELIOS_RANK_FAILURE_SWEEP=1: the thread rank
# above stops answering under the same collective timeout on rank zero (the same checks), test_rank_frames kills a
# rank process with two frames in flight, and test_server kills one while it serves.
if swept("HELIOS_RANK_FAILURE_SWEEP"):
    @pytest.mark.parametrize("how", (pytest.param(signal.SIGSTOP, id="stops-answering"),
                                     pytest.param(signal.SIGKILL, id="dies")))
    def test_a_lost_rank_ends_requests_in_flight_with_errors(cores, how):
        with running(cores.open(cores.core(QWEN3_MOE, 2)), PROCESSES) as runtime:
            lose_a_rank_mid_generation(runtime, how)
            a_late_request_fails(runtime.engine)


# Only with HELIOS_RANK_FAILURE_SWEEP=1 (defined only then, for the suite's time): test_stress_ranks'
# test_an_idle_group_outlives_its_collective_timeout_when_keepalives_are_rarer_than_polls idles a group past its
# collective timeout and generates after it, on the same keepalives.
if swept("HELIOS_RANK_FAILURE_SWEEP"):
    def test_an_idle_group_outlives_its_collective_timeout(cores):
        """Peers wait for rank zero's next message under the collective timeout; keepalive exchanges
        while the engine idles keep the group (and its health) alive for as long as it idles. (A 2 s timeout:
        the generation after the idle spell runs under it too, and at 1 s a loaded 2-core CI machine once
        starved a rank's step past it.)"""
        with running(cores.open(cores.core(QWEN3_MOE, 2)), replace(FAST, collective_timeout_s=2.0)) as runtime:
            time.sleep(5.0)  # two and a half collective timeouts without a plan
            assert runtime.engine.is_healthy
            results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
        assert [list(r.token_ids) for r in results] == cores.reference_tokens(QWEN3_MOE)


def test_a_rank_that_never_joins_fails_startup(cores):
    core = cores.open(cores.core(QWEN3_MOE, 2))
    options = replace(FAST, local_ranks=1, rendezvous=f"127.0.0.1:{free_port()}", join_timeout_s=0.5)
    with pytest.raises(MissingRankError, match=r"rank\(s\) \[1\] did not join"):
        build_runtime(core, RuntimeOptions(ranks=options))


def start_with_one_remote(core, address: str) -> tuple[threading.Thread, list]:
    """Rank zero of `core` in a thread, waiting for rank 1 on `address`; the list gets its outcome."""
    outcome: list = []

    def serve() -> None:
        options = replace(FAST, local_ranks=1, rendezvous=address, join_timeout_s=60.0)
        try:
            outcome.append(build_runtime(core, RuntimeOptions(ranks=options)))
        except LoadError as error:
            outcome.append(error)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("joiner", ["other-weights", "one-rank-core"])
def test_a_rank_with_another_core_is_refused(cores, joiner):
    theirs = cores.core(LLAMA3, 2) if joiner == "other-weights" else cores.core(QWEN3_MOE, 1)
    expected = "cache identity" if joiner == "other-weights" else "prepared for 1 ranks"
    address = f"127.0.0.1:{free_port()}"
    thread, outcome = start_with_one_remote(cores.open(cores.core(QWEN3_MOE, 2)), address)
    with pytest.raises(RankJoinError, match=expected):
        join_rank(cores.open(theirs), Rendezvous.join(address, timedelta(seconds=30)), None)
    thread.join(HANG_GUARD_S)
    (error,) = outcome
    assert isinstance(error, RankJoinError)
    assert "rank 1 refused to join" in str(error) and expected in str(error)

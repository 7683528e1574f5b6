"""Rank zero's control plane: messages cross in one preallocated buffer (spilling into a second
broadcast only when longer), and rank zero on two execution frames (LAUNCH / FINISH) gives the
tokens of one rank, with peers mirroring its launch/finish order."""

from __future__ import annotations

import dataclasses
import signal

import pytest

from helios.runtime.records.capacities import Operation
from helios.runtime.offline import generate
from helios.runtime.records.plan import StepPlan
from helios.runtime.parallel.rank_channel import StepChannel
from helios.runtime.parallel.rank_timing import PhaseTimers
from helios.runtime.parallel.rank_wire import MessageKind, StepMessage
from ignition.hf_checkpoints import LLAMA3, QWEN3_MOE
from support.sweeps import in_sweep

from .conftest import MAX_TOKENS, PROMPTS, running
from .test_collectives import on_ranks
from .test_failures import PROCESSES, a_late_request_fails, lose_a_rank_mid_generation
from .test_wire import spec


def test_messages_fit_the_buffer_or_spill_into_a_second_broadcast():
    short = StepMessage(MessageKind.STEP, StepPlan(1, 1, Operation.DECODE, None, (), (), 0, (spec("a"),)))
    long = StepMessage(MessageKind.STEP, StepPlan(2, 0, Operation.DECODE, None, (), (), 0,
                                                  (spec("b", tuple(range(300))),), ("a",)))
    finish = StepMessage(MessageKind.FINISH, sequence=7)

    def work(rank, group):
        timers = PhaseTimers()
        channel = StepChannel(group, timers, words=64)
        if rank == 0:
            for message in (short, long, finish):
                channel.send(message)
            return timers
        return [channel.receive() for _ in range(3)], timers

    zero, (received, timers) = on_ranks(work)
    assert received == [short, long, finish]
    assert zero.counts["send"] == 3 and timers.counts["receive"] == 3 and timers.counts["decode"] == 3


def test_two_frames_on_two_ranks_generate_what_one_rank_generates(cores):
    with running(cores.open(cores.core(LLAMA3, 2))) as runtime:
        engine, executor = runtime.engine, runtime.engine.executor
        engine.frames = 2  # the CPU does not overlap, but launch/finish must still be exact
        executor.timings(reset=True)
        results = generate(engine, PROMPTS, MAX_TOKENS)
        zero, one = executor.timings()
        seconds = engine.stats.second_frames
    assert [list(r.token_ids) for r in results] == cores.reference_tokens(LLAMA3)
    assert zero.counts["launch"] == one.counts["launch"] == zero.counts["finish"] == one.counts["finish"] > 0
    assert zero.counts["agree"] == one.counts["agree"] == zero.counts["launch"]
    assert seconds > 0  # a second plan was launched before the first finished: peers held two


def test_a_launch_that_fails_on_rank_zero_fails_that_plan_and_the_group_stays_in_step(cores):
    with running(cores.open(cores.core(LLAMA3, 2))) as runtime:
        executor = runtime.engine.executor
        generate(runtime.engine, PROMPTS[:1], 2)
        variant = dataclasses.replace(runtime.engine.scheduler.caps.variants[0], name="no-such-program")
        plan = StepPlan(10_000, 0, Operation.DECODE, variant, (), (), 0)
        launched = executor.launch(plan)
        assert isinstance(launched.error, KeyError)  # no rank has that program
        try:
            executor.finish(launched)
        except Exception as error:  # noqa: BLE001 - inspected below
            failure = error
        assert "rank 0 rejected submission 10000" in str(failure)
        assert executor.failure is None
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    assert [list(r.token_ids) for r in results] == cores.reference_tokens(LLAMA3)


# A stopped rank with two frames in flight only with HELIOS_RANK_FAILURE_SWEEP=1 (it waits out the 10 s collective
# timeout): test_failures' rank that stops answering fails rank zero at its collective timeout, and a killed one
# here loses both frames.
@pytest.mark.parametrize("how", in_sweep("HELIOS_RANK_FAILURE_SWEEP", (pytest.param(signal.SIGKILL, id="dies"),),
                                         (pytest.param(signal.SIGSTOP, id="stops-answering"),)))
def test_a_rank_lost_with_two_frames_in_flight_ends_requests_with_errors(cores, how):
    with running(cores.open(cores.core(QWEN3_MOE, 2)), PROCESSES) as runtime:
        runtime.engine.frames = 2
        lose_a_rank_mid_generation(runtime, how)
        a_late_request_fails(runtime.engine)

"""Every rank's phase timers reach rank zero in one exchange: program runs per operation on every
rank, message encode/send and agreement on rank zero, receive/decode/apply on the peer."""

from __future__ import annotations

import torch

from helios.runtime.offline import generate
from helios.runtime.parallel.rank_timing import PHASES, PhaseTimers
from ignition.hf_checkpoints import LLAMA3

from .conftest import MAX_TOKENS, PROMPTS, running


def test_timers_round_trip_as_a_tensor():
    timers = PhaseTimers()
    timers.add("send", 0.25)
    timers.add("run.decode", 1.5)
    timers.add("run.decode", 0.5)
    back = PhaseTimers.from_tensor(timers.as_tensor())
    assert back.nonzero() == {"send": (0.25, 1), "run.decode": (2.0, 2)}
    assert timers.as_tensor().shape == (2, len(PHASES)) and timers.as_tensor().dtype == torch.float64


def test_rank_zero_collects_every_ranks_phases(cores):
    with running(cores.open(cores.core(LLAMA3, 2))) as runtime:
        executor = runtime.engine.executor
        generate(runtime.engine, PROMPTS[:1], 2)
        executor.timings(reset=True)
        generate(runtime.engine, PROMPTS, MAX_TOKENS)
        zero, one = executor.timings(reset=True)
        again = executor.timings()
    steps = sum(count for name, (_, count) in zero.nonzero().items() if name.startswith("run."))
    assert steps > 0 and zero.counts["run.decode"] > 0 and zero.counts["run.prefill"] > 0
    for name in ("run.prefill", "run.decode", "agree"):
        assert one.counts[name] == zero.counts[name], name
    assert zero.counts["send"] >= steps and one.counts["receive"] >= steps and one.counts["decode"] >= steps
    assert all(seconds >= 0 for seconds, _ in zero.nonzero().values())
    assert again[0].counts["run.decode"] == 0 and again[1].counts["run.decode"] == 0  # reset

"""The hybrid (Mamba2 + attention) core through the runtime paths a CUDA model takes, emulated on
the CPU: two execution frames (second decode rounds fed by device-owned pending tokens), host-staged
packing, the exported program module (not the CPU fast path) replayed on the fixed argument list a
captured graph records, greedy-only sampling for greedy steps, snapshot restore and state offload
under two frames. Each gives transformers' greedy tokens, as one frame does
(tests/runtime/test_hybrid_runtime.py)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

import helios.runtime.loading.programs as program_loading
import helios.runtime.service as service
from helios.runtime.loading.cuda_graphs import CapturedProgram, greedy_module
from helios.runtime.execution.executor import GraphExecutor
from helios.runtime.loading.model import program_arguments
from helios.runtime.offline import generate
from helios.runtime.execution.packer import Packer
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from runtime.test_hybrid_runtime import PROMPTS, STEPS, expected, hybrid, runtime_of  # noqa: F401


class _Replayed(CapturedProgram):
    """A captured program's stand-in: its "graphs" are the eager module and its greedy variant
    (`greedy_module`), run on the recorded arguments whatever the call passes."""

    def __init__(self, module, arguments):
        self.module, self.greedy, self.arguments = module, greedy_module(module), arguments

    def replay(self, greedy: bool, fresh: bool = False):
        return (self.greedy if greedy else self.module)(*self.arguments)


def _two_frames(runtime):
    runtime.engine.frames = 2
    return runtime


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "host-staged"])
def test_two_frames_give_the_reference_tokens_batched(hybrid, expected, monkeypatch, staged):  # noqa: F811
    monkeypatch.setattr(service, "Packer", functools.partial(Packer, staged=staged))
    runtime = _two_frames(runtime_of(hybrid))
    try:
        results = generate(runtime.engine, PROMPTS, STEPS)
        assert runtime.engine.stats.second_frames > STEPS // 2
        assert [list(r.token_ids) for r in results] == expected
    finally:
        runtime.close()


def test_replayed_exported_programs_with_two_frames_give_the_reference_tokens(hybrid, expected, monkeypatch):  # noqa: F811
    monkeypatch.setattr(program_loading, "cpu_program", lambda module: module)  # what a CUDA model runs
    runtime = _two_frames(runtime_of(hybrid))
    executor, model = runtime.engine.executor, runtime.engine.executor.model
    programs = {
        name: dataclasses.replace(p, module=_Replayed(p.module, program_arguments(p, model.weights, model.buffers)))
        for name, p in executor._programs.items()
    }
    runtime.engine.executor = GraphExecutor(model, executor.packer, programs)
    try:
        results = generate(runtime.engine, PROMPTS, STEPS)
        assert [list(r.token_ids) for r in results] == expected
    finally:
        runtime.close()


def test_snapshot_restore_with_two_frames_gives_the_reference_tokens(hybrid, expected):  # noqa: F811
    runtime = _two_frames(runtime_of(hybrid))
    try:
        generate(runtime.engine, [PROMPTS[0]], STEPS)
        warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
        assert runtime.engine.scheduler.counters().snapshots_restored == 1
        assert list(warm.token_ids) == expected[1]
    finally:
        runtime.close()


def test_state_offload_with_two_frames_gives_the_reference_tokens(hybrid, expected):  # noqa: F811
    runtime = _two_frames(runtime_of(hybrid, num_pages=17, host_pages=32,
                                     policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD)))
    try:
        results = generate(runtime.engine, PROMPTS, STEPS)
        assert runtime.engine.scheduler.counters().preemptions > 0
        assert [list(r.token_ids) for r in results] == expected
    finally:
        runtime.close()

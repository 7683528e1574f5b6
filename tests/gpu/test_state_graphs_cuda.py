"""SNAPSHOT, RESTORATION and RESUME graphs on CUDA, eager and captured as CUDA graphs (the state-copy
programs replay like every other program): prompt-boundary snapshots published through the
SNAPSHOT program, a shared prefix restored through the RESTORATION program and continued in a
RESUME step, and preempted requests with offloaded state resumed, all with transformers' tokens;
the snapshot rows equal the CPU's (tests/runtime/test_state_graphs.py on the CPU)."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.execution.executor import GraphExecutor
from helios.runtime.loading.cuda_graphs import CapturedProgram
from helios.runtime.offline import generate
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from runtime.test_hybrid_runtime import PROMPTS, STEPS, expected, hybrid  # noqa: F401 (fixtures)
from runtime.test_state_graphs import _write, launches, state_core, state_runtime  # noqa: F401 (fixture)
from support.state_graphs_core import MARKS, RESTORE_MARK, SNAPSHOT_MARK

pytestmark = pytest.mark.gpu
MODES = pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])


@MODES
def test_state_programs_are_captured_with_the_others(hybrid, state_core, cuda_graphs):  # noqa: F811
    runtime = state_runtime(hybrid, state_core, device="cuda", cuda_graphs=cuda_graphs)
    try:
        programs = runtime.model.state_copy_programs
        assert {p.graph for p in programs} == {"snapshot", "restore"}
        assert all(isinstance(p.module, CapturedProgram) == cuda_graphs for p in programs)
        assert isinstance(runtime.engine.executor, GraphExecutor) == cuda_graphs
    finally:
        runtime.close()


@MODES
def test_shared_prefix_restores_through_the_restoration_graph_on_cuda(hybrid, expected, state_core,  # noqa: F811
                                                                      cuda_graphs):
    runtime = state_runtime(hybrid, state_core, device="cuda", cuda_graphs=cuda_graphs)
    try:
        assert list(generate(runtime.engine, [PROMPTS[0]], STEPS)[0].token_ids) == expected[0]
        warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
        assert list(warm.token_ids) == expected[1]
        counts = launches(runtime)
        assert counts["snapshot"] >= 1 and counts["restoration"] == 1 and counts["resume"] >= 1
        assert runtime.engine.scheduler.counters().snapshots_restored == 1
        marks = runtime.model.buffers[MARKS].tolist()
        assert any(SNAPSHOT_MARK <= m < RESTORE_MARK for m in marks) and any(m >= RESTORE_MARK for m in marks)
    finally:
        runtime.close()


@MODES
def test_offloaded_preempted_requests_resume_on_cuda(hybrid, expected, state_core, cuda_graphs):  # noqa: F811
    runtime = state_runtime(hybrid, state_core, device="cuda", cuda_graphs=cuda_graphs, num_pages=17,
                            host_pages=32, policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    try:
        results = generate(runtime.engine, PROMPTS, STEPS)
        assert runtime.engine.scheduler.counters().preemptions > 0 and launches(runtime)["resume"] > 0
        assert [list(r.token_ids) for r in results] == expected
    finally:
        runtime.close()


def test_a_restoration_program_that_restores_nothing_changes_the_tokens_on_cuda(hybrid, expected):  # noqa: F811
    runtime = state_runtime(hybrid, _write(hybrid, "broken_cuda.core", broken=True), device="cuda")
    try:
        generate(runtime.engine, [PROMPTS[0]], STEPS)
        warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
        assert launches(runtime)["restoration"] == 1 and list(warm.token_ids) != expected[1]
    finally:
        runtime.close()


def test_snapshot_rows_equal_the_cpus(hybrid, state_core):  # noqa: F811
    cpu = state_runtime(hybrid, state_core, num_pages=64)
    cuda = state_runtime(hybrid, state_core, device="cuda", num_pages=64)
    try:
        for runtime in (cpu, cuda):
            runtime.engine.frames = 1  # the same schedule on both devices
            generate(runtime.engine, [PROMPTS[0]], 4)
            generate(runtime.engine, [PROMPTS[1]], 4)
        torch.cuda.synchronize()
        first = cpu.model.num_slot_state_rows
        assert cpu.model.buffers[MARKS].tolist() == cuda.model.buffers[MARKS].tolist()
        for name in ("conv_state", "ssm_state"):
            on_cpu, on_cuda = cpu.model.buffers[name][:, first:], cuda.model.buffers[name][:, first:].cpu()
            assert on_cpu.abs().sum() > 0
            torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-4, atol=1e-4)
    finally:
        cpu.close()
        cuda.close()

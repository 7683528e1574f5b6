"""Cache policy with real captured programs: the same greedy tokens with or without prefix reuse,
under cache pressure that forces preemption and readmission, and at every concurrency."""

from __future__ import annotations

import pytest

from helios.runtime.loading.model import LoadOptions
from helios.runtime.records.plan import StorageKind
from helios.runtime.offline import generate
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime

from .test_model_fixture import open_fixture

SHARED = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]  # two complete 8-token pages
PROMPTS = [SHARED + [20, 21], SHARED + [30], [40, 41, 42], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7], [1]]
MAX_TOKENS = 20


def run(prompts, *, num_pages=None, prefix_caching=True, concurrency=None, sequential=False,
        preemption=PreemptionMode.RECOMPUTE, host_pages=0):
    from helios.contract import StartupOptions

    options = RuntimeOptions(
        load=LoadOptions(startup=StartupOptions(max_concurrency=concurrency), num_pages=num_pages),
        policy=SchedulerPolicy(preemption=preemption, prefix_caching=prefix_caching), host_pages=host_pages,
    )
    runtime = build_runtime(open_fixture(), options)
    if sequential:
        return [list(generate(runtime.engine, [p], MAX_TOKENS)[0].token_ids) for p in prompts], runtime
    return [list(r.token_ids) for r in generate(runtime.engine, prompts, MAX_TOKENS)], runtime


@pytest.fixture(scope="module")
def baseline():
    tokens, _ = run(PROMPTS, prefix_caching=False)
    return tokens


def test_prefix_hit_equals_miss(baseline):
    tokens, runtime = run(PROMPTS, sequential=True)  # sequential: later prompts find published pages
    assert tokens == baseline
    assert runtime.engine.scheduler.counters().prefix_reused_tokens >= len(SHARED)


def test_preemption_and_readmission_give_the_same_tokens(baseline):
    # 12 pages of 8 tokens cannot hold five requests of up to 38 tokens at once.
    tokens, runtime = run(PROMPTS, num_pages=12)
    assert tokens == baseline
    assert runtime.engine.scheduler.counters().preemptions > 0


def test_offload_preemption_restores_from_host_memory(baseline):
    tokens, runtime = run(PROMPTS, num_pages=12, preemption=PreemptionMode.OFFLOAD, host_pages=32)
    assert tokens == baseline
    assert runtime.engine.scheduler.counters().preemptions > 0
    host_planes, _ = runtime.engine.executor.storage.planes(StorageKind.HOST)
    assert any(plane.tensor.abs().sum() > 0 for plane in host_planes)  # pages went to host memory and back
    runtime.engine.scheduler.check_invariants()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_concurrency_does_not_change_tokens(baseline, concurrency):
    tokens, _ = run(PROMPTS, concurrency=concurrency)
    assert tokens == baseline

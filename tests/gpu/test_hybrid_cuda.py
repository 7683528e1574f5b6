"""The hybrid Mamba2 + attention core on CUDA, programs replayed as CUDA graphs: the recurrent ops
(helios::causal_conv_update, helios::ssm_scan) and the runtime's state-row copies (snapshot capture
into continuation rows, restore into a slot, offload to host slots) give transformers' greedy
tokens, as on the CPU (tests/runtime/test_hybrid_runtime.py)."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.offline import generate
from helios.runtime.records.plan import StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from runtime.test_hybrid_runtime import PROMPTS, STEPS, expected, hybrid, runtime_of  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu


def test_cuda_graphs_give_the_reference_tokens_batched(hybrid, expected):  # noqa: F811
    runtime = runtime_of(hybrid, device="cuda")
    assert [list(r.token_ids) for r in generate(runtime.engine, PROMPTS, STEPS)] == expected


def test_snapshot_restore_inside_cuda_graph_replays(hybrid, expected):  # noqa: F811
    runtime = runtime_of(hybrid, device="cuda")
    generate(runtime.engine, [PROMPTS[0]], STEPS)
    warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
    assert runtime.engine.scheduler.counters().snapshots_restored == 1
    assert list(warm.token_ids) == expected[1]
    _, rows = runtime.engine.executor.storage.planes(StorageKind.CONTINUATION)
    assert all(p.tensor.device.type == "cuda" for p in rows)


def test_state_offload_and_restore_on_cuda(hybrid, expected):  # noqa: F811
    runtime = runtime_of(hybrid, device="cuda", num_pages=17, host_pages=32,
                         policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    results = generate(runtime.engine, PROMPTS, STEPS)
    assert runtime.engine.scheduler.counters().preemptions > 0
    assert [list(r.token_ids) for r in results] == expected
    _, host_state = runtime.engine.executor.storage.planes(StorageKind.HOST)
    assert any(p.tensor.abs().sum() > 0 for p in host_state)  # state rows went to host slots and back


def test_pages_are_sized_from_free_device_memory(hybrid):  # noqa: F811
    from helios.runtime.loading.page_sizing import MAX_DEFAULT_PAGES, page_bytes

    runtime = runtime_of(hybrid, device="cuda")
    model = runtime.model
    assert model.num_pages > model.prepared.contract.page_capacity  # a tiny model: memory holds far more
    assert model.num_pages <= MAX_DEFAULT_PAGES
    assert model.num_pages * page_bytes(model.prepared) < torch.cuda.get_device_properties(0).total_memory

"""helios::paged_attention_sinks(_tuned) on CUDA: the CPU reference's result, no synchronisation, and a
captured CUDA graph replayed with other contexts, queries and sinks (the checks of test_ops_cuda)."""

from __future__ import annotations

import pytest
import torch

import helios.abi.attention_sinks  # noqa: F401  (registers the ops)
from gpu.test_ops_cuda import (
    ATTENTION_CASES, OPS, capture, close_attention, load, recontext, to_cuda, without_sync,
)
from support.abi_inputs import attention_inputs

pytestmark = pytest.mark.gpu
SINK_CASES = [case for case in ATTENTION_CASES if "fp16" not in case.name]


def sinks_inputs(case, seed: int, splits: int | None = None) -> dict:
    inputs = attention_inputs(case, seed)
    generator = torch.Generator().manual_seed(1000 + seed)
    inputs["sinks"] = 2.0 * torch.randn(case.q_heads, generator=generator)
    if splits is not None:
        inputs["splits"] = torch.tensor([splits], dtype=torch.int32)
    return inputs


def check_replayed(op, case, splits: int | None) -> None:
    function = getattr(OPS, op)
    inputs = sinks_inputs(case, 0, splits)
    close_attention(function(**to_cuda(inputs)), function(**inputs), inputs)
    cpu = sinks_inputs(case, 1, splits)
    static = to_cuda(cpu)
    close_attention(without_sync(lambda: function(**static)), function(**cpu), cpu)
    graph, output = capture(lambda: function(**static))
    for seed in (2, 3):
        fresh = sinks_inputs(recontext(case, seed), seed, None if splits is None else splits + seed)
        load(static, fresh)
        graph.replay()
        torch.cuda.synchronize()
        close_attention(output, function(**fresh), fresh)


@pytest.mark.parametrize("case", SINK_CASES, ids=lambda c: c.name)
def test_paged_attention_sinks(case):
    check_replayed("paged_attention_sinks", case, None)


@pytest.mark.parametrize("case", [c for c in SINK_CASES if c.name.startswith(("decode", "few-tokens"))],
                         ids=lambda c: c.name)
def test_paged_attention_sinks_tuned(case):
    """The split count is a device tensor: each replay reads another count (a schedule, same result)."""
    check_replayed("paged_attention_sinks_tuned", case, 3)

"""CPU programs over helios::paged_attention_chunked (Llama 4's chunked layers): the fast graph plans
the chunked calls of a step once, as it plans the other attention ops (a plan keyed by the chunk too),
and later calls equal the exported module's values bit for bit."""

from __future__ import annotations

import torch

import helios.abi.attention  # noqa: F401 (registers the ops)
import helios.abi.attention_chunked  # noqa: F401
from helios.abi import cpu_bodies
from helios.abi.paged_reference import plan_attention
from helios.runtime.loading.cpu_fast import chunked_attention_planned
from helios.runtime.loading.cpu_programs import CpuProgram, cpu_program

HEADS, KV_HEADS, DIM, PAGE_TOKENS, PAGES = 4, 2, 8, 4, 8
TOKENS = 6  # one row of 5 prompt tokens, one decode row


class _Attention(torch.nn.Module):
    """Three attention calls of one step: two chunked (chunk 3, a shared plan) and one unchunked."""

    def forward(self, weights, q, k_cache, v_cache, page_table, query_start, positions):
        first = torch.ops.helios.paged_attention_chunked(q * weights[0], k_cache[0], v_cache[0], page_table, query_start,
                                                         positions, 0.35, 0, 3)
        second = torch.ops.helios.paged_attention_chunked(first, k_cache[1], v_cache[1], page_table, query_start,
                                                          positions, 0.35, 0, 3)
        return (torch.ops.helios.paged_attention(second, k_cache[2], v_cache[2], page_table, query_start, positions,
                                                 0.35, 0),)


def _inputs(step: int):
    generator = torch.Generator().manual_seed(step)
    caches = [torch.randn(3, PAGES, PAGE_TOKENS, KV_HEADS, DIM, generator=generator) for _ in range(2)]
    positions = torch.tensor([3, 4, 5, 6, 7, 10]) + step
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    return [torch.randn(TOKENS, HEADS, DIM, generator=generator), *caches, table,
            torch.tensor([0, 5, 6], dtype=torch.int32), positions]


def test_chunked_calls_share_a_plan_and_equal_the_exported_module():
    weights = [torch.tensor(1.5)]
    exported = torch.export.export(_Attention(), (weights, *_inputs(0)), strict=False).module()
    program = cpu_program(torch.export.export(_Attention(), (weights, *_inputs(0)), strict=False).module())
    assert isinstance(program, CpuProgram) and program.fast is not None
    targets = [node.target for node in program.fast.graph.nodes if node.op == "call_function"]
    assert targets.count(plan_attention) == 2  # one for the chunk-3 calls, one for the unchunked call
    assert targets.count(chunked_attention_planned) == 2 and targets.count(cpu_bodies.attention_planned) == 1
    inputs = _inputs(0)
    for step in range(3):
        for tensor, value in zip(inputs, _inputs(step)):
            tensor.copy_(value)
        assert torch.equal(program(weights, *inputs)[0], exported(weights, *inputs)[0])

"""The decode attention kernel under programmatic dependent launch (`helios.abi.triton_decode`, its
programs wait for the previous kernel first thing): behind the product that writes its queries, keys
and values, and before the product that reads its output, layer after layer, in a replayed CUDA
graph, it gives the bits it gives without it (a race would show as a difference or a changed replay)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

HEADS, KV_HEADS, HEAD_DIM, PAGE, CONTEXT = 32, 8, 128, 16, 200


def _layers(x, layers, caches, step):
    """qkv product -> rotary decode attention (the step's keys and values written by the programs
    that read them) -> output product, per layer; each kernel reads what the one before it wrote."""
    from helios.abi.rotary_attention import triton_rotary_paged_attention

    rows = x.shape[0]
    page_table, query_start, positions, slots, cos, sin = step
    for (qkv_weight, o_weight), (k_cache, v_cache) in zip(layers, caches):
        qkv = F.linear(x, qkv_weight)
        q = qkv[:, : HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
        k = qkv[:, HEADS * HEAD_DIM: (HEADS + KV_HEADS) * HEAD_DIM].view(rows, KV_HEADS, HEAD_DIM)
        v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].view(rows, KV_HEADS, HEAD_DIM)
        attended = triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start,
                                                 positions, HEAD_DIM ** -0.5, 0)
        x = x + F.linear(attended.reshape(rows, -1), o_weight)
    return x


@pytest.mark.parametrize("rows", [1, 64])
def test_decode_attention_under_dependent_launch_keeps_the_bits(monkeypatch, rows):
    from helios.abi import dependent_launch
    from helios.abi.triton_decode import takes_dependent_launch

    assert takes_dependent_launch(torch.zeros(rows, 32, 128, device="cuda"))
    generator = torch.Generator().manual_seed(rows)
    hidden = HEADS * HEAD_DIM
    pages_per_row = -(-(CONTEXT + 1) // PAGE)
    num_pages = rows * pages_per_row
    layers = [((torch.randn(hidden + 2 * KV_HEADS * HEAD_DIM, hidden, generator=generator) / hidden ** 0.5),
               (torch.randn(hidden, hidden, generator=generator) / hidden ** 0.5)) for _ in range(4)]
    layers = [tuple(w.to(torch.bfloat16).cuda() for w in layer) for layer in layers]
    planes = [tuple(torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16)
                    for _ in range(2)) for _ in layers]
    page_table = torch.randperm(num_pages, generator=generator).view(rows, pages_per_row).to(torch.int32)
    positions = torch.full((rows,), CONTEXT, dtype=torch.int64)
    slots = page_table[:, CONTEXT // PAGE].to(torch.int64) * PAGE + CONTEXT % PAGE
    angles = torch.rand(rows, HEAD_DIM, generator=generator)
    step = tuple(t.cuda() for t in (page_table, torch.arange(rows + 1, dtype=torch.int32), positions, slots,
                                    angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)))
    initial = torch.randn(rows, hidden, generator=generator).to(torch.bfloat16)
    results = {}
    for enabled in (False, True):
        monkeypatch.setattr(dependent_launch, "ENABLED", enabled)
        caches = [tuple(p.cuda() for p in pair) for pair in planes]  # the keys written afresh each side
        static = initial.cuda()
        eager = _layers(static, layers, caches, step)
        _layers(static, layers, caches, step)  # compiled outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = _layers(static, layers, caches, step)
        replays = []
        for seed in (1, 2):
            static.copy_(torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
            graph.replay()
            replays.append(output.clone())
        torch.cuda.synchronize()
        results[enabled] = (eager, *replays)
    for without, with_pdl in zip(results[False], results[True]):
        assert torch.equal(without, with_pdl)
    assert not torch.equal(results[True][1], results[True][2])

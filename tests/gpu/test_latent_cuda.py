"""helios::latent_cache_write and helios::paged_latent_attention on CUDA: the CPU reference's results,
no synchronisation, and a captured CUDA graph replayed with new queries, caches, positions and page
tables gives the reference again. Shapes of a DeepSeek-V3 rank (C = 512, Dr = 64) and a tiny one."""

from __future__ import annotations

import pytest
import torch

from support.cuda_calls import capture, to_cuda, without_sync
import helios.abi.latent_attention  # noqa: F401  (registers the ops)

pytestmark = pytest.mark.gpu
OPS = torch.ops.helios
PAGE_TOKENS = 16


def attention_inputs(seed: int, rows: int, heads: int, latent: int, rope: int, dtype, max_context: int = 600):
    """Decode rows (one token each) over ragged contexts on shuffled pages; fixed shapes per case."""
    generator = torch.Generator().manual_seed(seed)
    max_pages = -(-max_context // PAGE_TOKENS)
    num_pages = rows * max_pages + 1
    contexts = torch.randint(1, max_context + 1, (rows,), generator=generator)
    table = torch.randperm(num_pages, generator=generator)[: rows * max_pages].view(rows, max_pages).to(torch.int32)
    return dict(
        q_latent=torch.randn(rows, heads, latent, generator=generator).to(dtype),
        q_rope=torch.randn(rows, heads, rope, generator=generator).to(dtype),
        latent_cache=torch.randn(num_pages, PAGE_TOKENS, latent, generator=generator).to(dtype),
        rope_cache=torch.randn(num_pages, PAGE_TOKENS, rope, generator=generator).to(dtype),
        page_table=table, query_start=torch.arange(rows + 1, dtype=torch.int32), positions=contexts - 1,
        scale=(128 + rope) ** -0.5)


CASES = [
    dict(rows=1, heads=16, latent=512, rope=64, dtype=torch.bfloat16),  # one DeepSeek-V3 rank of 8, batch 1
    dict(rows=64, heads=16, latent=512, rope=64, dtype=torch.bfloat16),
    dict(rows=8, heads=128, latent=512, rope=64, dtype=torch.bfloat16),  # all 128 heads on one device
    dict(rows=5, heads=4, latent=32, rope=16, dtype=torch.float32),  # the test checkpoints' shape
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['rows']}x{c['heads']}x{c['latent']}-{c['dtype']}")
def test_paged_latent_attention(case):
    tolerance = dict(rtol=1e-4, atol=1e-4) if case["dtype"] == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    function = OPS.paged_latent_attention

    def make(seed):
        return attention_inputs(seed, **case)

    def compare(actual, expected):
        torch.testing.assert_close(actual.cpu().float(), expected.float(), **tolerance)

    compare(function(**to_cuda(make(0))), function(**make(0)))
    static = to_cuda(make(1))
    compare(without_sync(lambda: function(**static)), function(**make(1)))
    graph, output = capture(lambda: function(**static))
    for seed in (2, 3):
        fresh = make(seed)
        for name, value in fresh.items():
            if isinstance(value, torch.Tensor):
                static[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        compare(output, function(**fresh))


def prompt_inputs(seed: int, query_lens, heads: int, latent: int, rope: int, dtype, max_context: int = 600):
    """Rows of several query tokens (prefill chunks, speculative lanes) over cached prefixes, plus a
    decode row and an inactive one; a fixed number of packed tokens (padding at the end)."""
    generator = torch.Generator().manual_seed(seed)
    rows, max_pages = len(query_lens), -(-max_context // PAGE_TOKENS)
    num_pages = rows * max_pages + 1
    cached = [int(torch.randint(0, max_context - n, (1,), generator=generator)) for n in query_lens]
    positions = [p for start, n in zip(cached, query_lens) for p in range(start, start + n)]
    tokens = sum(query_lens) + 3
    table = torch.randperm(num_pages, generator=generator)[: rows * max_pages].view(rows, max_pages).to(torch.int32)
    return dict(
        q_latent=torch.randn(tokens, heads, latent, generator=generator).to(dtype),
        q_rope=torch.randn(tokens, heads, rope, generator=generator).to(dtype),
        latent_cache=torch.randn(num_pages, PAGE_TOKENS, latent, generator=generator).to(dtype),
        rope_cache=torch.randn(num_pages, PAGE_TOKENS, rope, generator=generator).to(dtype),
        page_table=table, query_start=torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32),
        positions=torch.tensor(positions + [0] * 3, dtype=torch.int64), scale=(128 + rope) ** -0.5)


PROMPT_CASES = [
    dict(query_lens=[64, 1, 0, 7], heads=16, latent=512, rope=64, dtype=torch.bfloat16),  # DeepSeek-V3 rank of 8
    dict(query_lens=[5, 5, 5, 5], heads=128, latent=512, rope=64, dtype=torch.bfloat16),  # speculative lanes
    dict(query_lens=[33, 2, 9], heads=4, latent=32, rope=16, dtype=torch.float32),  # the test checkpoints' shape
]


@pytest.mark.parametrize("case", PROMPT_CASES, ids=lambda c: f"{c['query_lens']}x{c['heads']}x{c['latent']}")
def test_paged_latent_attention_of_multi_token_rows_in_a_graph(case):
    """The query-tile path (several tokens of a row per program, causal within the row) equals the
    CPU reference eagerly, without synchronisation and replayed in a CUDA graph with new inputs."""
    tolerance = dict(rtol=1e-4, atol=1e-4) if case["dtype"] == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    function = OPS.paged_latent_attention

    def compare(actual, expected):
        torch.testing.assert_close(actual.cpu().float(), expected.float(), **tolerance)

    static = to_cuda(prompt_inputs(1, **case))
    compare(without_sync(lambda: function(**static)), function(**prompt_inputs(1, **case)))
    graph, output = capture(lambda: function(**static))
    for seed in (2, 3):
        fresh = prompt_inputs(seed, **case)
        for name, value in fresh.items():
            if isinstance(value, torch.Tensor):
                static[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        compare(output, function(**fresh))


def test_latent_cache_write_in_a_graph():
    generator = torch.Generator().manual_seed(4)

    def make(seed):
        generator.manual_seed(seed)
        slots = torch.randperm(40 * PAGE_TOKENS, generator=generator)[:33]
        slots[5] = -1  # a padding token writes nothing
        return (torch.randn(33, 512, generator=generator).to(torch.bfloat16),
                torch.randn(33, 64, generator=generator).to(torch.bfloat16), slots)

    planes = (torch.zeros(40, PAGE_TOKENS, 512, dtype=torch.bfloat16),
              torch.zeros(40, PAGE_TOKENS, 64, dtype=torch.bfloat16))
    device_planes = tuple(p.cuda() for p in planes)
    static = tuple(t.cuda() for t in make(0))
    graph, _ = capture(lambda: OPS.latent_cache_write(*device_planes, *static))
    # capture() runs the call once eagerly (the side-stream warm-up) before capturing it, so the
    # device planes already hold seed 0's writes: the reference takes them too.
    OPS.latent_cache_write(*planes, *make(0))
    assert all(torch.equal(d.cpu(), p) for d, p in zip(device_planes, planes))
    for seed in (1, 2):
        fresh = make(seed)
        for target, value in zip(static, fresh):
            target.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        OPS.latent_cache_write(*planes, *fresh)
        assert all(torch.equal(d.cpu(), p) for d, p in zip(device_planes, planes))
    torch.cuda.set_sync_debug_mode("error")
    try:
        OPS.latent_cache_write(*device_planes, *static)
    finally:
        torch.cuda.set_sync_debug_mode("default")

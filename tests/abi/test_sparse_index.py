"""helios::index_key_write, helios::index_topk and helios::paged_latent_attention_selected (the token
indexer's ops, `helios.abi.sparse_index`): top-k against a direct per-token count over shuffled pages,
selected attention over every position against helios::paged_latent_attention, keys through the page
table, and argument checks."""

from __future__ import annotations

import pytest
import torch

from helios.abi import latent_attention as _latent  # noqa: F401  (registers helios::paged_latent_attention)
from helios.abi import sparse_index
from helios.abi.registry import AbiArgumentError
from support.host_sync import forbid_host_sync

OPS = torch.ops.helios
PAGE_TOKENS = 4


def packed(query_lens, cached_lens, seed, num_pages=12, padding=2):
    """(page_table, query_start, positions) of rows with `cached_lens` tokens cached and `query_lens`
    new ones, each row on shuffled pages, `padding` tokens past the last row."""
    generator = torch.Generator().manual_seed(seed)
    pages = torch.randperm(num_pages, generator=generator).to(torch.int32)
    width = max(-(-(c + q) // PAGE_TOKENS) for c, q in zip(cached_lens, query_lens))
    table = pages[:len(query_lens) * width].view(len(query_lens), width).contiguous()
    starts = [0]
    positions = []
    for cached, new in zip(cached_lens, query_lens):
        starts.append(starts[-1] + new)
        positions += range(cached, cached + new)
    positions += [0] * padding
    return table, torch.tensor(starts, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64)


def test_index_topk_is_the_direct_count():
    table, query_start, positions = packed([3, 1], [5, 9], seed=1)
    generator = torch.Generator().manual_seed(2)
    cache = torch.randn(12, PAGE_TOKENS, 6, generator=generator)
    q, weights = torch.randn(len(positions), 3, 6, generator=generator), torch.randn(len(positions), 3, generator=generator)
    topk, scale = 4, 0.3
    selected = OPS.index_topk(q, weights, cache, table, query_start, positions, scale, topk)
    for t in range(len(positions)):
        if t >= query_start[-1]:
            assert selected[t].tolist() == [-1] * topk  # padding selects nothing
            continue
        row = int(torch.searchsorted(query_start[1:], torch.tensor(t), right=True))
        scores = []
        for c in range(int(positions[t]) + 1):
            key = cache[table[row, c // PAGE_TOKENS], c % PAGE_TOKENS]
            scores.append((sum(float(weights[t, h]) * max(float(q[t, h] @ key) * scale, 0.0) for h in range(3)), c))
        best = [c for _, c in sorted(scores, key=lambda pair: (-pair[0], pair[1]))[:topk]]
        assert selected[t].tolist() == best + [-1] * (topk - len(best))


def test_selecting_every_position_is_dense_latent_attention():
    table, query_start, positions = packed([3, 2], [4, 6], seed=3)
    generator = torch.Generator().manual_seed(4)
    latent, rope = torch.randn(12, PAGE_TOKENS, 8, generator=generator), torch.randn(12, PAGE_TOKENS, 4, generator=generator)
    tokens = len(positions)
    q_latent, q_rope = torch.randn(tokens, 2, 8, generator=generator), torch.randn(tokens, 2, 4, generator=generator)
    order = torch.randperm(12, generator=generator)  # the order of the selection does not matter
    every = torch.where(order[None, :] <= positions[:, None], order[None, :], -1)
    every[int(query_start[-1]):] = -1
    selected = OPS.paged_latent_attention_selected(q_latent, q_rope, latent, rope, table, query_start, positions,
                                                   every, 0.4)
    dense = OPS.paged_latent_attention(q_latent, q_rope, latent, rope, table, query_start, positions, 0.4)
    torch.testing.assert_close(selected, dense, rtol=1e-5, atol=1e-6)
    assert torch.all(selected[int(query_start[-1]):] == 0)


def test_selected_attention_reads_only_the_selected_positions():
    table, query_start, positions = packed([1], [7], seed=5, padding=0)
    generator = torch.Generator().manual_seed(6)
    latent, rope = torch.randn(12, PAGE_TOKENS, 8, generator=generator), torch.randn(12, PAGE_TOKENS, 4, generator=generator)
    q_latent, q_rope = torch.randn(1, 2, 8, generator=generator), torch.randn(1, 2, 4, generator=generator)
    picked = torch.tensor([[5, -1, 2]])
    args = (table, query_start, positions, picked, 0.4)
    before = OPS.paged_latent_attention_selected(q_latent, q_rope, latent, rope, *args)
    for pos in range(8):  # every position but the picked ones NaN: the result does not change
        if pos not in (5, 2):
            page, offset = table[0, pos // PAGE_TOKENS], pos % PAGE_TOKENS
            latent[page, offset], rope[page, offset] = float("nan"), float("nan")
    assert torch.equal(OPS.paged_latent_attention_selected(q_latent, q_rope, latent, rope, *args), before)
    assert not torch.allclose(before, OPS.paged_latent_attention_selected(
        q_latent, q_rope, latent, rope, table, query_start, positions, torch.tensor([[5, -1, -1]]), 0.4))


def test_index_keys_land_through_the_page_table():
    table, query_start, positions = packed([5], [2], seed=6, padding=1)
    slots = table[0, positions // PAGE_TOKENS].long() * PAGE_TOKENS + positions % PAGE_TOKENS
    slots[-1] = -1
    cache, keys = torch.zeros(12, PAGE_TOKENS, 3), torch.randn(len(positions), 3)
    OPS.index_key_write(cache, keys, slots)
    for t in range(len(positions) - 1):
        assert torch.equal(cache[table[0, positions[t] // PAGE_TOKENS], positions[t] % PAGE_TOKENS], keys[t])
    assert int((cache.abs().sum(-1) > 0).sum()) == len(positions) - 1


@pytest.mark.parametrize("call, message", [
    (lambda q, w, c, t, s, p: OPS.index_topk(q, w, c, t, s, p, 0.5, 0), "topk"),
    (lambda q, w, c, t, s, p: OPS.index_topk(q, w.double(), c, t, s, p, 0.5, 2), "weights"),
    (lambda q, w, c, t, s, p: OPS.index_topk(q[..., :5], w, c, t, s, p, 0.5, 2), "q"),
    (lambda q, w, c, t, s, p: OPS.index_topk(q, w, c, t.long(), s, p, 0.5, 2), "page_table"),
    (lambda q, w, c, t, s, p: OPS.index_key_write(c, q[:, 0], p.int()), "slot_mapping"),
    (lambda q, w, c, t, s, p: OPS.index_key_write(c, q[:, 0, :4], p), "keys"),
    (lambda q, w, c, t, s, p: OPS.index_key_write(c[0], q[:, 0], p), "index_cache"),
])
def test_bad_arguments_are_refused(call, message):
    table, query_start, positions = packed([2], [1], seed=7, padding=0)
    q, weights, cache = torch.randn(2, 3, 6), torch.randn(2, 3), torch.randn(12, PAGE_TOKENS, 6)
    with pytest.raises(AbiArgumentError, match=message):
        call(q, weights, cache, table, query_start, positions)


def test_a_small_workspace_gives_the_same_results(monkeypatch):
    """With room for one token at a time the bodies loop over the packed tokens: the same picks and
    attention as all at once."""
    table, query_start, positions = packed([4, 2], [3, 5], seed=8)
    generator = torch.Generator().manual_seed(9)
    cache, latent, rope = (torch.randn(12, PAGE_TOKENS, width, generator=generator) for width in (6, 8, 4))
    tokens = len(positions)
    q, weights = torch.randn(tokens, 3, 6, generator=generator), torch.randn(tokens, 3, generator=generator)
    q_latent, q_rope = torch.randn(tokens, 2, 8, generator=generator), torch.randn(tokens, 2, 4, generator=generator)

    def run():
        picks = OPS.index_topk(q, weights, cache, table, query_start, positions, 0.3, 3)
        return picks, OPS.paged_latent_attention_selected(q_latent, q_rope, latent, rope, table, query_start,
                                                          positions, picks, 0.4)

    whole = run()
    monkeypatch.setattr(sparse_index, "WORKSPACE_BYTES", 1)
    assert sparse_index._chunks(tokens, 100) == [slice(t, t + 1) for t in range(tokens)]
    picks, attended = run()
    assert torch.equal(picks, whole[0])
    torch.testing.assert_close(attended, whole[1], rtol=1e-6, atol=1e-7)


def test_the_bodies_never_read_device_data_on_the_host():
    """CUDA graphs capture these bodies (no Triton kernels yet): no host read, no host tensor, with
    padding tokens in the batch (the key write's duplicate slots)."""
    table, query_start, positions = packed([3, 2], [4, 5], seed=10)
    generator = torch.Generator().manual_seed(11)
    cache, latent, rope = (torch.randn(12, PAGE_TOKENS, width, generator=generator) for width in (6, 8, 4))
    tokens = len(positions)
    q, weights = torch.randn(tokens, 3, 6, generator=generator), torch.randn(tokens, 3, generator=generator)
    q_latent, q_rope = torch.randn(tokens, 2, 8, generator=generator), torch.randn(tokens, 2, 4, generator=generator)
    slots = (table[torch.searchsorted(query_start[1:], torch.arange(tokens), right=True).clamp(max=1),
                   positions // PAGE_TOKENS].long() * PAGE_TOKENS + positions % PAGE_TOKENS)
    slots[int(query_start[-1]):] = -1
    written = cache.clone()
    OPS.index_key_write(written, q[:, 0], slots)
    selected = OPS.index_topk(q, weights, written, table, query_start, positions, 0.3, 4)
    attended = OPS.paged_latent_attention_selected(q_latent, q_rope, latent, rope, table, query_start, positions,
                                                   selected, 0.4)
    with forbid_host_sync():
        sparse_index.index_key_write.body(cache, q[:, 0], slots)
        got_selected = sparse_index.index_topk.body(q, weights, cache, table, query_start, positions, 0.3, 4)
        got_attended = sparse_index.paged_latent_attention_selected.body(
            q_latent, q_rope, latent, rope, table, query_start, positions, got_selected, 0.4)
    assert torch.equal(cache, written) and torch.equal(got_selected, selected)
    assert torch.equal(got_attended, attended)

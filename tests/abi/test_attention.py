"""helios::paged_attention and helios::cache_write against a dense reference.

Each random layout has several rows of different lengths, some continuing from cached history,
some inactive, scattered over non-contiguous pages, grouped-query heads, optional sliding windows
and padding tokens. The dense reference attends over each row's contiguous history with an
explicit mask and never touches pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helios.abi.attention import CACHE_WRITE_SCHEMA, PAGED_ATTENTION_SCHEMA  # registers the ops
from helios.abi.program_image import decode_program, encode_program
from helios.abi.registry import AbiArgumentError, registered_schemas

HEAD_DIM = 8


@dataclass
class Layout:
    """A packed step: per-row histories, query lengths, page tables, and the packed tensors."""

    history: list[tuple[torch.Tensor, torch.Tensor]]  # per row: keys, values [context, Hkv, D]
    query_lens: list[int]
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor
    query_start: torch.Tensor
    positions: torch.Tensor


def make_layout(seed, query_lens, cached_lens, num_kv_heads, groups, page_tokens, padding) -> Layout:
    generator = torch.Generator().manual_seed(seed)
    contexts = [cached + new for cached, new in zip(cached_lens, query_lens)]
    row_pages = [-(-context // page_tokens) for context in contexts]
    num_pages = sum(row_pages) + 3
    order = torch.randperm(num_pages, generator=generator).tolist()  # non-contiguous pages
    k_cache = torch.randn(num_pages, page_tokens, num_kv_heads, HEAD_DIM, generator=generator)
    v_cache = torch.randn(k_cache.shape, generator=generator)
    page_table = torch.full((len(contexts), max(row_pages) + 2), 10_000, dtype=torch.int32)  # junk tail
    history = []
    for row, context in enumerate(contexts):
        pages = [order.pop() for _ in range(row_pages[row])]
        page_table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        keys = torch.randn(context, num_kv_heads, HEAD_DIM, generator=generator)
        values = torch.randn(context, num_kv_heads, HEAD_DIM, generator=generator)
        for position in range(context):
            page, offset = pages[position // page_tokens], position % page_tokens
            k_cache[page, offset], v_cache[page, offset] = keys[position], values[position]
        history.append((keys, values))
    num_tokens = sum(query_lens) + padding
    positions = [p for cached, new in zip(cached_lens, query_lens) for p in range(cached, cached + new)]
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return Layout(
        history, list(query_lens),
        torch.randn(num_tokens, num_kv_heads * groups, HEAD_DIM, generator=generator),
        k_cache, v_cache, page_table, starts,
        torch.tensor(positions + [0] * padding, dtype=torch.int64),
    )


def dense_reference(layout: Layout, scale: float, window: int) -> torch.Tensor:
    out = torch.zeros_like(layout.q)
    start = 0
    for (keys, values), length in zip(layout.history, layout.query_lens):
        positions = layout.positions[start:start + length]
        q = layout.q[start:start + length].transpose(0, 1)  # [Hq, n, D]
        groups = q.shape[0] // keys.shape[1]
        k = keys.repeat_interleave(groups, dim=1).transpose(0, 1)
        v = values.repeat_interleave(groups, dim=1).transpose(0, 1)
        cached = torch.arange(keys.shape[0])
        mask = cached[None, :] <= positions[:, None]
        if window:
            mask &= positions[:, None] - cached[None, :] < window
        scores = (q @ k.transpose(1, 2)) * scale
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        out[start:start + length] = (probs @ v).transpose(0, 1)
        start += length
    return out


def attend(layout: Layout, scale: float, window: int) -> torch.Tensor:
    return torch.ops.helios.paged_attention(
        layout.q, layout.k_cache, layout.v_cache, layout.page_table, layout.query_start,
        layout.positions, scale, window)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**16),
    rows=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 13)), min_size=1, max_size=4),
    num_kv_heads=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 3]),
    page_tokens=st.sampled_from([1, 4, 5]),
    window=st.sampled_from([0, 1, 3, 6]),
    padding=st.integers(0, 3),
)
def test_paged_attention_matches_dense_reference(seed, rows, num_kv_heads, groups, page_tokens, window, padding):
    query_lens = [new for new, _ in rows]  # 0 = an inactive row
    cached_lens = [cached for _, cached in rows]
    layout = make_layout(seed, query_lens, cached_lens, num_kv_heads, groups, page_tokens, padding)
    out = attend(layout, 0.3, window)
    torch.testing.assert_close(out, dense_reference(layout, 0.3, window), rtol=1e-5, atol=1e-5)
    assert torch.all(out[sum(query_lens):] == 0)  # padding tokens


def test_inactive_rows_do_not_change_active_rows():
    layout = make_layout(1, [3, 0, 5], [4, 2, 7], 2, 2, 4, padding=2)
    with_inactive = attend(layout, 0.5, 0)
    without = torch.ops.helios.paged_attention(
        layout.q, layout.k_cache, layout.v_cache, layout.page_table[[0, 2]],
        torch.tensor([0, 3, 8], dtype=torch.int32), layout.positions, 0.5, 0)
    torch.testing.assert_close(with_inactive, without)
    assert with_inactive[:8].abs().sum() > 0


def test_bfloat16_caches_return_bfloat16():
    layout = make_layout(2, [2, 3], [1, 6], 2, 2, 4, padding=1)
    half = {name: getattr(layout, name).to(torch.bfloat16) for name in ("q", "k_cache", "v_cache")}
    out = torch.ops.helios.paged_attention(half["q"], half["k_cache"], half["v_cache"], layout.page_table,
                                           layout.query_start, layout.positions, 0.4, 0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense_reference(layout, 0.4, 0), rtol=0.05, atol=0.05)


def test_cache_write_fills_slots_in_place_and_skips_negative_slots():
    k_cache = torch.zeros(3, 4, 2, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    pointers = (k_cache.data_ptr(), v_cache.data_ptr())
    k, v = torch.randn(4, 2, HEAD_DIM), torch.randn(4, 2, HEAD_DIM)
    torch.ops.helios.cache_write(k_cache, v_cache, k, v, torch.tensor([9, -1, 2, -1]))
    assert (k_cache.data_ptr(), v_cache.data_ptr()) == pointers
    torch.testing.assert_close(k_cache[2, 1], k[0])
    torch.testing.assert_close(v_cache[0, 2], v[2])
    assert k_cache.count_nonzero() == 2 * 2 * HEAD_DIM  # nothing else was written


def test_schemas_are_registered_as_declared():
    schemas = registered_schemas()
    assert schemas["helios::cache_write"] == "helios::cache_write" + CACHE_WRITE_SCHEMA
    assert schemas["helios::paged_attention"] == "helios::paged_attention" + PAGED_ATTENTION_SCHEMA


def test_wrong_arguments_are_rejected():
    layout = make_layout(3, [2], [0], 1, 1, 4, padding=0)
    with pytest.raises(AbiArgumentError, match="page_table"):
        torch.ops.helios.paged_attention(layout.q, layout.k_cache, layout.v_cache, layout.page_table.long(),
                                         layout.query_start, layout.positions, 1.0, 0)
    with pytest.raises(AbiArgumentError, match="slot_mapping"):
        torch.ops.helios.cache_write(layout.k_cache, layout.v_cache, layout.q[:, :1], layout.q[:, :1],
                                     torch.tensor([0, 1], dtype=torch.int32))
    too_far = layout.positions + 100
    with pytest.raises(AbiArgumentError, match="pages"):
        torch.ops.helios.paged_attention(layout.q, layout.k_cache, layout.v_cache, layout.page_table,
                                         layout.query_start, too_far, 1.0, 0)


class _WriteThenAttend(torch.nn.Module):
    def forward(self, k_cache, v_cache, q, k, v, slot_mapping, page_table, query_start, positions):
        torch.ops.helios.cache_write(k_cache[1], v_cache[1], k, v, slot_mapping)
        return torch.ops.helios.paged_attention(q, k_cache[1], v_cache[1], page_table, query_start, positions, 0.5, 2)


def test_ops_survive_export_save_and_load_and_write_in_place():
    caches = torch.zeros(2, 4, 4, 1, HEAD_DIM), torch.zeros(2, 4, 4, 1, HEAD_DIM)
    q, k, v = torch.randn(3, 2, HEAD_DIM), torch.randn(3, 1, HEAD_DIM), torch.randn(3, 1, HEAD_DIM)
    step = (torch.tensor([5, 6, 7]), torch.tensor([[3, 1]], dtype=torch.int32),
            torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1, 2, 3]))
    exported = torch.export.export(_WriteThenAttend(), (*caches, q, k, v, *step), strict=False)
    assert not exported.graph_signature.user_inputs_to_mutate  # no functional write-back
    exported.example_inputs = None
    loaded = decode_program(encode_program(exported)).module()  # stored as a program image
    fresh = torch.zeros(2, 4, 4, 1, HEAD_DIM), torch.zeros(2, 4, 4, 1, HEAD_DIM)
    pointer = fresh[0].data_ptr()
    out = loaded(*fresh, q, k, v, *step)
    assert fresh[0].data_ptr() == pointer
    torch.testing.assert_close(fresh[0][1, 1, 1:4], k)  # slots 5..7 = page 1, offsets 1..3
    eager = _WriteThenAttend()(*caches, q, k, v, *step)
    torch.testing.assert_close(out, eager)


def test_decode_rows_of_different_lengths_never_read_past_their_pages():
    """One-token rows are attended together over the longest row's pages; a shorter row's table
    entries past its last page are junk (10,000 here) and must not be read."""
    layout = make_layout(4, [1, 1, 1], [1, 8, 3], 2, 2, 4, padding=1)
    out = attend(layout, 0.4, 0)
    torch.testing.assert_close(out, dense_reference(layout, 0.4, 0), rtol=1e-5, atol=1e-5)

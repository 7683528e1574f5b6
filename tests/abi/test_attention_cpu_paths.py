"""The CPU reference's shortcuts give the general path's values bit for bit: a full decode step
(row r owns token r, no padding) returns its rows directly, and writes without padding slots skip
the selection of kept tokens."""

from __future__ import annotations

import pytest
import torch

from abi.test_attention import make_layout
from helios.abi.attention import _reference_attention


@pytest.mark.parametrize("cached_lens, page_tokens, window", [([5], 4, 0), ([0, 17, 3, 9], 4, 0),
                                                              ([30, 2, 12], 16, 5)])
def test_a_full_decode_step_equals_the_same_rows_with_a_padding_token(cached_lens, page_tokens, window):
    rows = len(cached_lens)
    padded = make_layout(7, [1] * rows, cached_lens, 2, 2, page_tokens, padding=1)
    full = _reference_attention(padded.q[:rows], padded.k_cache, padded.v_cache, padded.page_table,
                                padded.query_start, padded.positions[:rows], 0.3, window)
    general = _reference_attention(padded.q, padded.k_cache, padded.v_cache, padded.page_table,
                                   padded.query_start, padded.positions, 0.3, window)
    assert torch.equal(full, general[:rows]) and not general[rows:].any()


def test_junk_page_entries_past_a_rows_pages_never_change_its_values():
    layout = make_layout(3, [1, 1, 1], [1, 20, 6], 2, 1, 4, padding=0)
    first = _reference_attention(layout.q, layout.k_cache, layout.v_cache, layout.page_table,
                                 layout.query_start, layout.positions, 0.5, 0)
    table = layout.page_table.clone()
    table[0, 1:] = -7  # past row 0's only page: negative junk instead of 10,000
    table[2, 2:] = 1
    again = _reference_attention(layout.q, layout.k_cache, layout.v_cache, table, layout.query_start,
                                 layout.positions, 0.5, 0)
    assert torch.equal(first, again)


def test_writes_without_padding_fill_every_slot_in_place():
    k_cache, v_cache = torch.zeros(3, 4, 1, 2), torch.zeros(3, 4, 1, 2)
    k, v = torch.randn(3, 1, 2), torch.randn(3, 1, 2)
    torch.ops.helios.cache_write(k_cache, v_cache, k, v, torch.tensor([11, 0, 5]))
    flat_k, flat_v = k_cache.view(12, 1, 2), v_cache.view(12, 1, 2)
    assert torch.equal(flat_k[[11, 0, 5]], k) and torch.equal(flat_v[[11, 0, 5]], v)
    assert int(flat_k.abs().sum(dim=(1, 2)).gt(0).sum()) == 3  # nothing else written
    torch.ops.helios.cache_write(k_cache, v_cache, k[:0], v[:0], torch.tensor([], dtype=torch.int64))  # nothing
    assert torch.equal(flat_k[[11, 0, 5]], k)

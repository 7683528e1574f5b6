"""The flash-decoding kernels of `helios.abi.triton_decode` against the CPU reference: splits cut each
token's own span (short rows in a long capacity, more splits than tiles), every tile of the benchmark
sweep, GQA ratios, windows, and the shape-keyed tile table. Batches are the poisoned ones of
test_triton_attention (a kernel that reads outside a row's context returns NaN); without CUDA the
kernels run under Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import triton_decode as decode
from support.sweeps import in_sweep
from test_triton_attention import DEVICE, Shape, assert_matches_reference, make_batch, run

RAGGED = [0, 3, 17, 40, 70]  # cached tokens before each row's one new token


def with_capacity(batch: base.Batch, max_pages: int) -> base.Batch:
    """The batch with page tables widened to `max_pages` columns of the poison page (as a capacity
    much longer than any row): only the splits' cut of each token's own span keeps work balanced."""
    k_cache, v_cache, table = batch.poisoned
    wide = torch.full((table.shape[0], max_pages), k_cache.shape[0] - 1, dtype=table.dtype)
    wide[:, : table.shape[1]] = table
    clean = torch.zeros_like(wide)
    clean[:, : table.shape[1]] = batch.clean[2]
    return replace(batch, poisoned=(k_cache, v_cache, wide), clean=(*batch.clean[:2], clean))


# 16 splits already leave the splits past a token's tiles (at most 5 tiles of 16 positions here) empty; 2, 5, 64
# (the interpreter's slowest) with HELIOS_KERNEL_SWEEP=1 (and on CUDA)
@pytest.mark.parametrize("split", in_sweep("HELIOS_KERNEL_SWEEP", (1, 16), (2, 5, 64)) if not base.ON_CUDA
                         else (1, 2, 5, 16, 64))
def test_short_rows_in_a_long_capacity_with_any_split_count(split):
    """Up to 64 splits over rows of 1 to 71 positions in a 1,024-position capacity: splits past a
    token's tiles are empty and weigh nothing in the combine."""
    batch = with_capacity(make_batch(30, [1] * 5, RAGGED, Shape(page_tokens=8)), 128)
    assert decode.grid_splits(128 * 8, split, 16) == split
    tile = decode.DecodeTile(block_n=16, min_split_tokens=16)
    out = run(decode.paged_attention_decode, batch, 0, split=split, tile=tile)
    assert_matches_reference(out, batch, 0)


@pytest.mark.parametrize("tile", [decode.DecodeTile(16, 2, 1, 16), decode.DecodeTile(32, 4, 3, 64),
                                  decode.DecodeTile(128, 8, 2)], ids=["n16", "n32", "n128"])
def test_every_tile_is_exact(tile):
    batch = make_batch(31, [1] * 5, RAGGED, Shape(page_tokens=16))
    assert_matches_reference(run(decode.paged_attention_decode, batch, 0, split=3, tile=tile), batch, 0)


@pytest.mark.parametrize("group, num_kv_heads", [(1, 4), (3, 2), (8, 1)])
def test_grouped_query_heads_share_each_program(group, num_kv_heads):
    shape = Shape(group=group, num_kv_heads=num_kv_heads, page_tokens=4)
    batch = make_batch(32, [1] * 5, RAGGED, shape)
    assert_matches_reference(run(decode.paged_attention_decode, batch, 0, split=4), batch, 0)


@pytest.mark.parametrize("split", [1, 3], ids=["one-split-grid", "split3"])
@pytest.mark.parametrize("window", [1, 6, 33])
def test_window_spans_are_cut_into_splits(window, split):
    """The span starts at pos - window + 1: splits cut only the visible positions, and released pages
    below the window are never read (a one-split grid walks the whole visible span)."""
    batch = base.release_below_window(make_batch(33, [1] * 5, RAGGED, Shape(page_tokens=4)), window)
    tile = decode.DecodeTile(block_n=16, min_split_tokens=16)
    assert_matches_reference(run(decode.paged_attention_decode, batch, window, split=split, tile=tile), batch,
                             window)


def test_tuned_one_split_grid_ignores_the_count():
    """A tuned launch whose grid bound is 1 compiles no partials: any count gives the reference."""
    batch = make_batch(35, [2, 0, 1, 1], [30, 3, 12, 61], Shape(page_tokens=8), padding=1)
    splits = torch.tensor([7], dtype=torch.int32, device=DEVICE)
    out = run(decode.paged_attention_decode_tuned, batch, 0, splits=splits, bound=1,
              tile=decode.DecodeTile(block_n=16, min_split_tokens=16))
    assert_matches_reference(out, batch, 0)


@pytest.mark.parametrize("count", [1, 3, 40])
def test_tuned_count_with_a_multi_token_row_and_padding(count):
    batch = make_batch(34, [2, 0, 1, 1], [30, 3, 12, 61], Shape(page_tokens=8), padding=1)
    splits = torch.tensor([count], dtype=torch.int32, device=DEVICE)
    out = run(decode.paged_attention_decode_tuned, batch, 0, splits=splits,
              tile=decode.DecodeTile(block_n=16, min_split_tokens=16))
    assert_matches_reference(out, batch, 0)


def test_tile_table_is_keyed_by_head_dim_and_batch_bucket(monkeypatch):
    wide = decode.DecodeTile(128, 8, 3)
    monkeypatch.setitem(decode.DECODE_TILES, (128, 64), wide)
    assert decode.decode_tile(64, 128) == wide and decode.decode_tile(17, 128) == wide
    assert decode.decode_tile(16, 128) == decode.DEFAULT_TILE  # another bucket
    assert decode.decode_tile(64, 64) == decode.DEFAULT_TILE  # another head_dim
    assert decode.decode_tile(1000, 128) == decode.decode_tile(256, 128)  # past the last bucket: the 256 bucket


@pytest.mark.parametrize("min_split_tokens", [16, 32, 1000])
def test_short_spans_get_fewer_runs_not_shorter_ones(min_split_tokens):
    """The same result whether a 71-position span is cut into 5 runs of 16, 3 of 32 or kept whole."""
    batch = make_batch(36, [1] * 5, RAGGED, Shape(page_tokens=8))
    tile = decode.DecodeTile(block_n=16, min_split_tokens=min_split_tokens)
    assert tile.min_split_tiles == -(-min_split_tokens // 16)
    assert_matches_reference(run(decode.paged_attention_decode, batch, 0, split=8, tile=tile), batch, 0)


def test_grid_splits_are_bounded_by_capacity_tiles():
    assert decode.grid_splits(1024, 8, 64) == 8
    assert decode.grid_splits(100, 8, 64) == 2  # no more splits than capacity tiles
    assert decode.grid_splits(1 << 20, 500, 64) == 64  # at most DECODE_MAX_SPLITS
    assert decode.grid_splits(64, 0, 64) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [None, decode.DecodeTile(32, 4, 3), decode.DecodeTile(128, 8, 2)],
                         ids=["table", "n32", "n128"])
def test_llama_8b_shapes_on_cuda_in_a_graph(tile):
    """8B attention shapes (32 query heads, 8 key/value heads, head_dim 128, bf16, pages of 16), ragged
    contexts up to 1,500 in a 2,064-position capacity, tuned split counts replayed from a CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    shape = Shape(num_kv_heads=8, group=4, head_dim=128, page_tokens=16, dtype=torch.bfloat16)
    batch = with_capacity(make_batch(35, [1] * 6, [0, 15, 100, 511, 1024, 1499], shape), 129)
    k_cache, v_cache, table = (t.cuda() for t in batch.poisoned)
    inputs = [t.cuda() for t in (batch.q, batch.query_start, batch.positions)]
    splits = torch.tensor([1], dtype=torch.int32, device="cuda")

    def step():
        return decode.paged_attention_decode_tuned(inputs[0], k_cache, v_cache, table, *inputs[1:], base.SCALE, 0,
                                                   splits, tile=tile)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for count in (1, 2, 7, 16):
        splits.fill_(count)
        graph.replay()
        assert_matches_reference(out.cpu(), batch, 0)


@pytest.mark.gpu
def test_batch_64_runs_a_one_split_grid_on_cuda():
    """At 64 tokens of 8 key/value heads the tuned bound is 1: the compiled one-split kernel (no
    partials, no combine) gives the reference at 8B shapes whatever count the tensor holds."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    shape = Shape(num_kv_heads=8, group=4, head_dim=128, page_tokens=16, dtype=torch.bfloat16)
    batch = with_capacity(make_batch(37, [1] * 64, [(37 * i) % 700 for i in range(64)], shape), 129)
    assert decode.tuned_split_bound(64, 8, 129 * 16) == 1
    for count in (1, 5):
        splits = torch.tensor([count], dtype=torch.int32, device="cuda")
        assert_matches_reference(run(decode.paged_attention_decode_tuned, batch, 0, splits=splits), batch, 0)

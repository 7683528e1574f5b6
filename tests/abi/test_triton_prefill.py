"""The prefill kernel of helios::paged_attention (`helios.abi.triton_prefill`) against the CPU reference:
unmasked and diagonal tiles, split-KV and its combine, windows, sinks, packed rows, both dtypes; the
split rule; and (marked gpu) Llama-8B head shapes, with CUDA graph capture and replay.

The batches are those of test_triton_attention (poisoned caches: a kernel that reads outside a row's
context or below its window returns NaN). Small tiles (16 pairs, 16 positions, runs of 16 positions)
make tiny shapes cross several tiles and splits under the interpreter.
"""

from __future__ import annotations

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import attention_sinks  # noqa: F401  (registers the ops)
from helios.abi import triton_prefill as prefill
from test_triton_attention import (
    MIXED_CACHED, MIXED_LENS, SCALE, Shape, assert_matches_reference, make_batch, release_below_window, run,
)

SMALL = prefill.PrefillTile(16, 16, 2, 1, 16)  # 16 (token, head) pairs, 16 positions, runs of >= 1 tile
WIDE = prefill.PrefillTile(32, 32, 4, 2, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_cold_prompt_on_partial_pages(dtype, splits):
    """One row of 45 tokens on pages of 8 (the last page partial): unmasked tiles below the diagonal,
    masked diagonal tiles; with 3 splits the long blocks' spans are cut and combined."""
    batch = make_batch(31, [45], [0], Shape(dtype=dtype))
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=SMALL, splits=splits), batch, 0)


@pytest.mark.parametrize("splits", [1, 2, 4, 16])
def test_chunk_after_a_cached_prefix_split_and_unsplit(splits):
    """A short chunk after a long cached prefix (the cached-prompt case), any split count: 16 splits
    over fewer tiles leaves empty runs, which the combine must ignore."""
    batch = make_batch(32, [7], [90], Shape(page_tokens=4))
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=SMALL, splits=splits), batch, 0)


@pytest.mark.parametrize("splits", [1, 3])
def test_packed_rows_with_padding_and_one_token_rows(splits):
    batch = make_batch(33, MIXED_LENS, MIXED_CACHED, Shape(group=4, num_kv_heads=1, page_tokens=4), padding=3)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=SMALL, splits=splits), batch, 0)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=WIDE, splits=splits), batch, 0)


@pytest.mark.parametrize("window", [3, 11, 40])
@pytest.mark.parametrize("splits", [1, 3])
def test_windows_read_nothing_below_them(window, splits):
    """Windows of 3 (inside one tile), 11 and 40 (across tiles and splits): pages wholly below each row's
    window point at the NaN page, as after their release."""
    batch = release_below_window(make_batch(34, [30, 5, 1], [2, 60, 20], Shape(page_tokens=4), padding=1), window)
    out = run(prefill.paged_attention_prefill, batch, window, tile=SMALL, splits=splits)
    assert_matches_reference(out, batch, window)


@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_count_once_across_splits(splits):
    batch = make_batch(35, [9, 3], [40, 0], Shape(page_tokens=4), padding=1)
    generator = torch.Generator().manual_seed(6)
    sinks = 2.0 * torch.randn(batch.q.shape[1], generator=generator)
    k_cache, v_cache, table = batch.clean
    expected = torch.ops.helios.paged_attention_sinks(batch.q, k_cache, v_cache, table, batch.query_start,
                                                      batch.positions, SCALE, 5, sinks)
    out = run(prefill.paged_attention_prefill, batch, 5, tile=SMALL, splits=splits, sinks=sinks.to(base.DEVICE))
    torch.testing.assert_close(out, expected, **base.TOLERANCE[batch.q.dtype])


def test_head_dim_and_group_that_are_not_powers_of_two_split():
    batch = make_batch(36, [20, 2], [33, 4], Shape(head_dim=96, group=3, num_kv_heads=1, page_tokens=16), padding=1)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=SMALL, splits=3), batch, 0)


@pytest.mark.parametrize("lens, cached", [([40], [50]), ([12, 1], [50, 3])], ids=["long-rows", "short-rows"])
def test_served_tile_and_split_rule(lens, cached):
    """The served choices (`prefill_tile`, `prefill_splits`) with no overrides: the default tile for a
    long row, SHORT_ROWS_TILE for rows shorter than its blocks."""
    batch = make_batch(37, lens, cached, Shape(dtype=torch.bfloat16, page_tokens=16))
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0), batch, 0)


def test_split_rule_depends_on_shapes_only(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(prefill, "multiprocessors", lambda device: 132)  # an H200
    assert prefill.prefill_splits(2048 // 32 + 1, 8, 4096, cpu) == 1  # 520 programs fill the device
    assert prefill.prefill_splits(256 // 32 + 1, 8, 4096, cpu) == 2  # a bound of 72 programs: 1 per multiprocessor
    assert prefill.prefill_splits(208 // 32 + 1, 8, 4096, cpu, per_multiprocessor=2) == 5  # 56 programs
    assert prefill.prefill_splits(7, 8, 512, cpu, per_multiprocessor=2) == 2  # runs of >= 256 capacity positions
    assert prefill.prefill_splits(1, 1, 1 << 20, cpu) == prefill.PREFILL_MAX_SPLITS


def test_tile_choice():
    served = prefill.PREFILL_TILES.get(128, prefill.DEFAULT_PREFILL_TILE)
    assert prefill.prefill_tile(128, torch.bfloat16, 512, 1) == prefill.prefill_tile(128, torch.bfloat16) == served
    assert prefill.prefill_tile(128, torch.bfloat16, 2048, 1) == prefill.LONG_PREFILL_TILES[128]  # long launches
    assert prefill.prefill_tile(128, torch.bfloat16, 2048, 256) == prefill.SHORT_ROWS_TILE  # 256 rows of 8 tokens
    assert prefill.prefill_tile(128, torch.bfloat16, 320, 65) == prefill.SHORT_ROWS_TILE  # decode lanes beside a prompt
    assert prefill.prefill_tile(128, torch.float32).block_pairs <= 64  # float32 rows: a tile that fits
    assert SMALL.min_split_tiles == 1 and prefill.DEFAULT_PREFILL_TILE.min_split_tiles == 4


# Llama-3.1-8B head shapes on the device.

LLAMA = Shape(num_kv_heads=8, group=4, head_dim=128, page_tokens=16, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("new, cached", [(2048, 0), (208, 1840), (512, 0), (128, 0)])
def test_llama_shapes_on_the_device(new, cached):
    batch = make_batch(38, [new], [cached], LLAMA)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0), batch, 0)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, splits=4), batch, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4])
def test_llama_shapes_with_a_window_read_nothing_below_it(splits):
    batch = release_below_window(make_batch(41, [208, 64], [1840, 300], LLAMA, padding=16), 700)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 700, splits=splits), batch, 700)


@pytest.mark.gpu
def test_llama_shapes_replay_in_a_cuda_graph_with_other_prefix_lengths():
    """Capture the op once (its split count fixed from shapes); replay it with a step of the same token
    count but another cached prefix and row layout: the runs follow the new spans."""
    first = make_batch(39, [200, 8], [1840, 0], LLAMA)
    second = make_batch(40, [8, 200], [600, 1200], LLAMA)
    capacity = max(first.poisoned[2].shape[1], second.poisoned[2].shape[1])
    pages = max(first.poisoned[0].shape[0], second.poisoned[0].shape[0])

    def widened(batch):
        k_cache, v_cache, table = batch.poisoned
        wide = torch.full((table.shape[0], capacity), k_cache.shape[0] - 1, dtype=torch.int32)  # the NaN page
        wide[:, : table.shape[1]] = table
        grown = [torch.cat([c, c[-1:].expand(pages - c.shape[0], *c.shape[1:])]) for c in (k_cache, v_cache)]
        return [t.cuda() for t in (batch.q, *grown, wide, batch.query_start, batch.positions)]

    inputs = widened(first)
    assert prefill.prefill_splits(208 // 32 + 2, 8, capacity * 16, inputs[0].device) > 1  # the split path runs

    def step():
        return torch.ops.helios.paged_attention(*inputs, SCALE, 0)

    step()  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    assert_matches_reference(out.cpu(), first, 0)
    for buffer, value in zip(inputs, widened(second)):
        buffer.copy_(value)
    graph.replay()
    assert_matches_reference(out.cpu(), second, 0)

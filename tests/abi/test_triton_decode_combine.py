"""The decode kernel's single-launch combine (the last run of a split token merges the partials, a
per-token counter reset in the kernel), its prefetch levels and its row lookup, against the CPU
reference and against the two-launch combine. Batches are the poisoned ones of test_triton_attention
(a kernel that reads outside a row's context returns NaN); without CUDA the kernels run under
Triton's interpreter. The GPU tests (8B head shapes) replay one captured graph over new spans.
"""

from __future__ import annotations

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import attention_sinks  # noqa: F401  (registers the sinks reference op)
from helios.abi import triton_decode as decode
from test_triton_attention import DEVICE, SCALE, Shape, assert_matches_reference, make_batch, run
from test_triton_decode import RAGGED, with_capacity

SMALL = dict(block_n=16, min_split_tokens=16)  # runs of one 16-position tile: every span of RAGGED splits


def counters_are_zero() -> bool:
    """Every fused-combine counter workspace is back at zero (what the next launch or replay needs)."""
    return all(int(counters.abs().sum()) == 0 for counters in decode._COUNTERS.values())


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize("fused", [True, False], ids=["one-launch", "combine-launch"])
def test_both_combines_at_every_prefetch_level(fused, prefetch):
    batch = make_batch(40, [1] * 5, RAGGED, Shape(page_tokens=8))
    tile = decode.DecodeTile(**SMALL, fused_combine=fused, prefetch=prefetch)
    assert_matches_reference(run(decode.paged_attention_decode, batch, 0, split=4, tile=tile), batch, 0)
    assert counters_are_zero()


def test_one_launch_combine_twice_with_new_spans_on_the_same_counters():
    """Two launches of one shape (as two replays of a captured step) with different spans: the counters
    the first leaves behind are zero, so the second combines exactly its own runs."""
    tile = decode.DecodeTile(**SMALL)
    for seed, cached in ((41, RAGGED), (42, [70, 0, 33, 5, 17])):
        batch = with_capacity(make_batch(seed, [1] * 5, cached, Shape(page_tokens=8)), 16)
        assert_matches_reference(run(decode.paged_attention_decode, batch, 0, split=5, tile=tile), batch, 0)
        assert counters_are_zero()


@pytest.mark.parametrize("group, num_kv_heads", [(1, 3), (4, 2), (6, 1)])
@pytest.mark.parametrize("window", [0, 21])
def test_one_launch_combine_with_grouped_heads_and_windows(group, num_kv_heads, window):
    shape = Shape(group=group, num_kv_heads=num_kv_heads, page_tokens=4)
    batch = make_batch(43, [1] * 5, RAGGED, shape)
    batch = base.release_below_window(batch, window) if window else batch
    out = run(decode.paged_attention_decode, batch, window, split=3, tile=decode.DecodeTile(**SMALL))
    assert_matches_reference(out, batch, window)


@pytest.mark.parametrize("count", [2, 6])
def test_one_launch_combine_counts_each_sink_once(count):
    batch = make_batch(44, [1] * 5, RAGGED, Shape(page_tokens=8))
    sinks = 2.0 * torch.randn(batch.q.shape[1], generator=torch.Generator().manual_seed(7))
    splits = torch.tensor([count], dtype=torch.int32, device=DEVICE)
    out = run(decode.paged_attention_decode_tuned, batch, 0, splits=splits, sinks=sinks.to(DEVICE),
              tile=decode.DecodeTile(**SMALL, prefetch=2))
    k_cache, v_cache, table = batch.clean
    expected = torch.ops.helios.paged_attention_sinks(batch.q, k_cache, v_cache, table, batch.query_start,
                                                      batch.positions, SCALE, 0, sinks)
    torch.testing.assert_close(out, expected, **base.TOLERANCE[batch.q.dtype])


WIDE = {"n4": decode.DecodeTile(4, 4, 2, 16, wide=True),
        "n16-p2": decode.DecodeTile(16, 4, 2, 16, wide=True, prefetch=2),
        "n8-combine-launch": decode.DecodeTile(8, 4, 2, 16, wide=True, fused_combine=False, prefetch=0)}


@pytest.mark.parametrize("tile_id, split, group, num_kv_heads, window", [
    ("n4", 4, 2, 2, 0), ("n16-p2", 4, 3, 3, 9), ("n8-combine-launch", 4, 1, 4, 0), ("n4", 1, 3, 3, 9),
    ("n16-p2", 1, 2, 2, 0)])
def test_wide_tiles_serve_every_head_of_a_token(tile_id, split, group, num_kv_heads, window):
    """A wide program reads all key/value heads of its positions (3 heads pad to 4 columns, masked)
    and each query head attends only its own: split and unsplit, windows, GQA and plain heads."""
    batch = make_batch(46, [1] * 5, RAGGED, Shape(group=group, num_kv_heads=num_kv_heads, page_tokens=4))
    batch = base.release_below_window(batch, window) if window else batch
    out = run(decode.paged_attention_decode, batch, window, split=split, tile=WIDE[tile_id])
    assert_matches_reference(out, batch, window)
    assert counters_are_zero()


def test_rows_without_tokens_fall_back_to_the_row_search():
    """Empty rows (and a padding token) shift tokens off their row's index: the lookup that guesses
    row = token must fall back to the search, and the split runs still merge."""
    batch = make_batch(45, [0, 1, 0, 1, 1, 0], [9, 40, 3, 0, 63, 12], Shape(page_tokens=8), padding=1)
    out = run(decode.paged_attention_decode, batch, 0, split=4, tile=decode.DecodeTile(**SMALL))
    assert_matches_reference(out, batch, 0)


def test_tiles_parse_from_the_benchmark_strings():
    assert decode.DecodeTile.parse("64x4x2") == decode.DecodeTile(64, 4, 2)
    assert decode.DecodeTile.parse("32x4x3x64x2xc") == decode.DecodeTile(32, 4, 3, 64, False, 2)
    assert decode.DecodeTile.parse("8x4x3x64xw") == decode.DecodeTile(8, 4, 3, 64, wide=True)
    for tile in (decode.DecodeTile(128, 8, 2, 256, prefetch=0), decode.DecodeTile(8, 4, 2, 32, False, 2, True)):
        assert decode.DecodeTile.parse(tile.label) == tile
    for bad in ("64x4", "64x4x2x128x3", "64xfourx2", "64x4x2x1x1x1", "64x4x2xwxw", "64x4x2xq"):
        with pytest.raises(ValueError, match="decode tile"):
            decode.DecodeTile.parse(bad)


EIGHT_B = Shape(num_kv_heads=8, group=4, head_dim=128, page_tokens=16, dtype=torch.bfloat16)


def _load(inputs: list[torch.Tensor], batch: base.Batch) -> None:
    """Copy `batch` into the captured step's inputs: its pages into the front of the (larger, NaN)
    cache planes, the rest as they are (the same shapes from batch to batch)."""
    q, k_cache, v_cache, table, query_start, positions = inputs
    k_pages, v_pages, pages = batch.poisoned
    k_cache.fill_(float("nan"))
    v_cache.fill_(float("nan"))
    k_cache[: k_pages.shape[0]].copy_(k_pages)
    v_cache[: v_pages.shape[0]].copy_(v_pages)
    pairs = ((q, batch.q), (table, pages), (query_start, batch.query_start), (positions, batch.positions))
    for target, source in pairs:
        target.copy_(source)


def _graph_step(batches: list[base.Batch], tile: decode.DecodeTile, count: int):
    """(inputs, graph, out): one tuned decode launch captured on CUDA at the batches' shapes, the cache
    planes as large as the largest batch's."""
    first = batches[0]
    num_pages = max(batch.poisoned[0].shape[0] for batch in batches)
    planes = [torch.empty((num_pages, *first.poisoned[0].shape[1:]), dtype=first.q.dtype, device="cuda")
              for _ in range(2)]
    inputs = [first.q.cuda(), *planes, first.poisoned[2].cuda(), first.query_start.cuda(), first.positions.cuda()]
    _load(inputs, first)
    splits = torch.tensor([count], dtype=torch.int32, device="cuda")

    def step():
        return decode.paged_attention_decode_tuned(*inputs, SCALE, 0, splits, tile=tile, bound=count)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return inputs, graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("batch_size, count, tile", [
    (1, 16, decode.DecodeTile(32, 4, 2, 32)), (1, 8, decode.DecodeTile(128, 8, 2, 128, prefetch=2)),
    (64, 2, decode.DecodeTile(64, 4, 2, 64)), (64, 4, decode.DecodeTile(64, 4, 2, 64, prefetch=0)),
    (64, 4, decode.DecodeTile(8, 4, 3, 64, wide=True)), (1, 16, decode.DecodeTile(16, 8, 2, 32, wide=True)),
], ids=["b1-n32", "b1-n128-p2", "b64-2", "b64-4-p0", "b64-wide", "b1-wide"])
def test_one_launch_combine_replays_new_spans_at_8b_shapes(batch_size, count, tile):
    """8B heads (32 query, 8 key/value, head_dim 128, bf16, pages of 16), contexts 1-1,500 in a 2,064-
    position capacity: one graph captured, replayed over new positions and pages of the same shapes
    (the counters reset in the kernel), each replay against the reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    spans = [[(97 * i + 611 * seed) % 1500 for i in range(batch_size)] for seed in (1, 2)]
    batches = [with_capacity(make_batch(50 + seed, [1] * batch_size, cached, EIGHT_B), 129)
               for seed, cached in enumerate(spans)]
    inputs, graph, out = _graph_step(batches, tile, count)
    for batch in batches + batches[:1]:
        _load(inputs, batch)
        graph.replay()
        assert_matches_reference(out.cpu(), batch, 0)
    assert counters_are_zero()

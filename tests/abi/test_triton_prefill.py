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
from helios.abi import triton_prefill_tiles as tiles
from support.sweeps import swept
from test_triton_attention import (
    MIXED_CACHED, MIXED_LENS, SCALE, Batch, Shape, assert_matches_reference, make_batch, release_below_window, run,
)

# On CPU (the interpreter) the suite runs one of the variants that launch the same kernel code: a fused layout
# unsplit launches its unfused layout's kernel (a one-split launch compiles no combine), so it runs only with
# HELIOS_KERNEL_SWEEP=1, and so do the middle split counts and windows named at each test. On CUDA all run.
SWEEP = swept("HELIOS_KERNEL_SWEEP") or base.ON_CUDA

SMALL = prefill.PrefillTile(16, 16, 2, 1, 16)  # 16 (token, head) pairs, 16 positions, runs of >= 1 tile
WIDE = prefill.PrefillTile(32, 32, 4, 2, 32)
PER_HEAD = prefill.PrefillTile(16, 16, 2, 1, 16, per_head=True)  # 16 tokens of one query head
FUSED = prefill.PrefillTile(16, 16, 2, 1, 16, fused_combine=True)  # the last run merges: no combine launch
FUSED_PER_HEAD = prefill.PrefillTile(16, 16, 2, 1, 16, per_head=True, fused_combine=True)
LAYOUT_NAMES = {SMALL: "packed", PER_HEAD: "per-head", FUSED: "fused", FUSED_PER_HEAD: "fused-per-head"}


def layouts(splits: tuple, swept_splits: tuple = ()) -> pytest.MarkDecorator:
    """Parametrizes (tile, splits) over the four layouts and `splits` (and `swept_splits` with the sweep);
    a fused layout unsplit only with the sweep (the default test of its unfused layout takes its path)."""
    counts = splits + swept_splits if SWEEP else splits
    return pytest.mark.parametrize("tile, splits", [
        pytest.param(tile, count, id=f"{name}-{count}") for count in counts for tile, name in LAYOUT_NAMES.items()
        if SWEEP or count > 1 or not tile.fused_combine])


@layouts((1, 3))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cold_prompt_on_partial_pages(dtype, splits, tile):
    """One row of 45 tokens on pages of 8 (the last page partial): unmasked tiles below the diagonal,
    masked diagonal tiles; with 3 splits the long blocks' spans are cut and combined."""
    batch = make_batch(31, [45], [0], Shape(dtype=dtype))
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=splits), batch, 0)


@layouts((1, 4, 16), swept_splits=(2,))  # 2: split as 4 is
def test_chunk_after_a_cached_prefix_split_and_unsplit(splits, tile):
    """A short chunk after a long cached prefix (the cached-prompt case), any split count: 16 splits
    over fewer tiles leaves empty runs, which the combine must ignore."""
    batch = make_batch(32, [7], [90], Shape(page_tokens=4))
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=splits), batch, 0)
    assert all(not buffer.any() for kept in prefill._COUNTERS.values() for buffer in kept)  # re-armed


@pytest.mark.parametrize("splits", [1, 3])
def test_packed_rows_with_padding_and_one_token_rows(splits):
    batch = make_batch(33, MIXED_LENS, MIXED_CACHED, Shape(group=4, num_kv_heads=1, page_tokens=4), padding=3)
    for tile in (SMALL, WIDE, PER_HEAD, FUSED_PER_HEAD):
        assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=splits), batch, 0)


@pytest.mark.parametrize("tile, splits", [
    pytest.param(tile, splits, id=f"{name}-{splits}") for splits in (1, 3) for tile, name in (
        (SMALL, "packed"), (PER_HEAD, "per-head"), (FUSED, "fused"),
        (prefill.PrefillTile(16, 16, 2, 1, per_head=True), "per-head-unsplit"))
    if SWEEP or splits > 1 or not tile.fused_combine])  # fused unsplit: packed's kernel
def test_padding_tokens_are_written_over_an_uninitialised_output(monkeypatch, tile, splits):
    """The output is allocated uninitialised: the kernel itself zeroes padding tokens (here 21 of
    them, more than a block, behind rows with an inactive one between), so NaN-filled memory
    must not show through anywhere."""
    monkeypatch.setattr(prefill, "_output_like", lambda q: torch.full_like(q, float("nan")))
    batch = make_batch(42, [9, 0, 13], [4, 6, 30], Shape(page_tokens=4), padding=21)
    out = run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=splits)
    assert not out.isnan().any()
    assert_matches_reference(out, batch, 0)


@layouts((1, 3))
@pytest.mark.parametrize("window", [3, 40] + [11] * SWEEP)  # 11 crosses tiles as 40 does (40 splits too)
def test_windows_read_nothing_below_them(window, splits, tile):
    """Windows of 3 (inside one tile), 11 and 40 (across tiles and splits): pages wholly below each row's
    window point at the NaN page, as after their release."""
    batch = release_below_window(make_batch(34, [30, 5, 1], [2, 60, 20], Shape(page_tokens=4), padding=1), window)
    out = run(prefill.paged_attention_prefill, batch, window, tile=tile, splits=splits)
    assert_matches_reference(out, batch, window)


@layouts((1, 3))
def test_sinks_count_once_across_splits(splits, tile):
    batch = make_batch(35, [9, 3], [40, 0], Shape(page_tokens=4), padding=1)
    generator = torch.Generator().manual_seed(6)
    sinks = 2.0 * torch.randn(batch.q.shape[1], generator=generator)
    k_cache, v_cache, table = batch.clean
    expected = torch.ops.helios.paged_attention_sinks(batch.q, k_cache, v_cache, table, batch.query_start,
                                                      batch.positions, SCALE, 5, sinks)
    out = run(prefill.paged_attention_prefill, batch, 5, tile=tile, splits=splits, sinks=sinks.to(base.DEVICE))
    torch.testing.assert_close(out, expected, **base.TOLERANCE[batch.q.dtype])


@pytest.mark.parametrize("tile", list(LAYOUT_NAMES), ids=list(LAYOUT_NAMES.values()))
def test_head_dim_and_group_that_are_not_powers_of_two_split(tile):
    batch = make_batch(36, [20, 2], [33, 4], Shape(head_dim=96, group=3, num_kv_heads=2, page_tokens=16), padding=1)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=3), batch, 0)


def on_consecutive_pages(batch: Batch, scatter_row: int | None = None) -> Batch:
    """The batch with its rows' pages renumbered consecutive in row order (caches permuted to match),
    as a fresh prompt's in-order pages are; `scatter_row`'s first two pages swapped (not consecutive)."""
    num_pages, table = batch.clean[0].shape[0], batch.poisoned[2]
    order = [page for page in dict.fromkeys(table.flatten().tolist()) if page != num_pages - 1]
    order += [page for page in range(num_pages - 1) if page not in set(order)]
    new_id = torch.empty(num_pages, dtype=torch.long)
    new_id[torch.tensor(order)] = torch.arange(len(order))
    new_id[num_pages - 1] = num_pages - 1  # the poison page stays last
    if scatter_row is not None:
        pair = table[scatter_row, :2].long()
        new_id[pair] = new_id[pair.flip(0)]

    def moved(cache):
        out = torch.empty_like(cache)
        out[new_id] = cache
        return out

    clean, poisoned = ((moved(k), moved(v), new_id[t.long()].to(torch.int32))
                       for k, v, t in (batch.clean, batch.poisoned))
    return Batch(batch.q, clean, poisoned, batch.query_start, batch.positions, batch.num_real_tokens)


CONTIGUOUS_TILES = [prefill.parse_tile(name) for name in ("t16x16x2x1x16", "ht16x32x2x1x16", "hct16x16x2x1x16")]


@pytest.mark.parametrize("tile, window, splits", [
    pytest.param(tile, window, splits, id=f"{window}-{splits}-{tile.name}")
    for window, splits in ((0, 1), (0, 3), (40, 3)) for tile in CONTIGUOUS_TILES
    if SWEEP or splits > 1 or not tile.fused_combine])  # the fused tile unsplit: the per-head one's path
def test_consecutive_pages_are_read_through_descriptors(monkeypatch, tile, window, splits):
    """Rows on consecutive pages (one row's first pages swapped: it gathers) with padding, windows and
    splits: the descriptor path gives the reference's result, and (under the interpreter, no window)
    it ran."""
    calls = []
    if not base.ON_CUDA:  # a spy the interpreter calls as it is; the compiler would reject it
        original = prefill.attend_contiguous
        monkeypatch.setattr(prefill, "attend_contiguous", lambda *args: calls.append(1) or original.fn(*args))
    batch = on_consecutive_pages(make_batch(45, [45, 30, 1], [3, 40, 9], Shape(page_tokens=4), padding=3), 1)
    batch = release_below_window(batch, window) if window else batch
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, window, tile=tile, splits=splits), batch,
                             window)
    assert base.ON_CUDA or window or calls  # a window of 40 may leave a block no whole tile


@pytest.mark.parametrize("lens, cached", [([40], [50]), ([12, 1], [50, 3])], ids=["long-rows", "short-rows"])
def test_served_tile_and_split_rule(lens, cached):
    """The served choices (`prefill_tile`, `prefill_splits`) with no overrides: the default tile for a
    long row, SHORT_ROWS_TILE for rows shorter than its blocks."""
    batch = make_batch(37, lens, cached, Shape(dtype=torch.bfloat16, page_tokens=16))
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0), batch, 0)


def test_split_rule_depends_on_shapes_only(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(tiles, "multiprocessors", lambda device: 132)  # an H200
    assert prefill.prefill_splits(2048 // 32 + 1, 8, 4096, cpu) == 1  # 520 programs fill the device
    assert prefill.prefill_splits(256 // 32 + 1, 8, 4096, cpu) == 2  # a bound of 72 programs: 1 per multiprocessor
    assert prefill.prefill_splits(208 // 32 + 1, 8, 4096, cpu, per_multiprocessor=2) == 5  # 56 programs
    assert prefill.prefill_splits(7, 8, 512, cpu, per_multiprocessor=2) == 2  # runs of >= 256 capacity positions
    assert prefill.prefill_splits(1, 1, 1 << 20, cpu) == prefill.PREFILL_MAX_SPLITS
    assert prefill.prefill_splits(1, 1, 1 << 20, cpu, max_splits=1) == 1  # a tile that never splits
    assert prefill.prefill_splits(2048 // 128 + 1, 32, 4096, cpu) == 1  # per head: 544 programs


def test_tile_choice():
    served = prefill.PREFILL_TILES.get(128, prefill.DEFAULT_PREFILL_TILE)
    assert prefill.prefill_tile(128, torch.bfloat16, 512, 1) == prefill.prefill_tile(128, torch.bfloat16) == served
    assert prefill.prefill_tile(128, torch.bfloat16, 2048, 1) == prefill.LONG_PREFILL_TILES[128]  # long launches
    assert prefill.prefill_tile(128, torch.bfloat16, 128, 1) == prefill.SHORT_PREFILL_TILES[128]  # short launches
    assert prefill.prefill_tile(64, torch.float32, 128, 1) == prefill.PREFILL_TILES.get(64, prefill.DEFAULT_PREFILL_TILE)  # 16-bit only
    assert prefill.prefill_tile(128, torch.bfloat16, 2048, 256) == prefill.SHORT_ROWS_TILE  # 256 rows of 8 tokens
    assert prefill.prefill_tile(128, torch.bfloat16, 320, 65) == prefill.SHORT_ROWS_TILE  # decode lanes beside a prompt
    assert prefill.prefill_tile(128, torch.float32).block_pairs <= 64  # float32 rows: a tile that fits
    assert SMALL.min_split_tiles == 1 and prefill.DEFAULT_PREFILL_TILE.min_split_tiles == 4
    assert PER_HEAD.block_tokens(4) == 16 and SMALL.block_tokens(4) == 4 and SMALL.block_tokens(3) == 4


@pytest.mark.parametrize("name", ["128x64x8x3", "h128x128x8x3", "64x64x4x2x256x1", "h64x64x4x2x512", "hc128x64x8x3",
                                  "c64x64x4x2", "hct128x64x8x3", "t64x64x4x2"])
def test_tile_names_read_back(name):
    assert prefill.parse_tile(name).name == name
    assert prefill.parse_tile(name).per_head == name.startswith("h")
    assert prefill.parse_tile(name).fused_combine == ("c" in name)
    assert prefill.parse_tile(name).contiguous == ("t" in name)


@pytest.mark.parametrize("name", ["128x64x8", "h1x2x3x4x5x6x7", "128x64xeightx3", "ch128x64x8x3", "th64x64x4x2"])
def test_malformed_tile_names_are_refused(name):
    with pytest.raises(ValueError):
        prefill.parse_tile(name)


# Llama-3.1-8B head shapes on the device.

LLAMA = Shape(num_kv_heads=8, group=4, head_dim=128, page_tokens=16, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("new, cached", [(2048, 0), (208, 1840), (512, 0), (128, 0), (128, 1920)])
def test_llama_shapes_on_the_device(new, cached):
    batch = make_batch(38, [new], [cached], LLAMA)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0), batch, 0)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, splits=4), batch, 0)


# Per-head tiles of the sweep: both key/value tile widths, 8 and 4 warps, fused combine (their
# compilation dominates the device time, so not every swept tile).
PER_HEAD_TILES = ["h128x64x8x3", "h128x128x8x3", "h64x64x4x3", "hc128x64x8x3"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PER_HEAD_TILES)
@pytest.mark.parametrize("new, cached", [(2048, 0), (208, 1840)])
def test_llama_shapes_per_head(name, new, cached):
    batch = make_batch(43, [new], [cached], LLAMA)
    tile = prefill.parse_tile(name)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile), batch, 0)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=3), batch, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["t128x128x8x3", "ht128x64x8x3", "ht64x64x4x3"])
@pytest.mark.parametrize("new, cached", [(2048, 0), (208, 1840)])
def test_llama_shapes_on_consecutive_pages(name, new, cached):
    batch = on_consecutive_pages(make_batch(46, [new], [cached], LLAMA))
    tile = prefill.parse_tile(name)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile), batch, 0)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 0, tile=tile, splits=3), batch, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["h128x128x8x3", "64x64x4x2x256x1", "128x128x8x3", "c64x64x4x2", "c128x64x8x3"])
def test_llama_shapes_packed_rows_and_padding_over_garbage(monkeypatch, name):
    monkeypatch.setattr(prefill, "_output_like", lambda q: torch.full_like(q, float("nan")))
    batch = make_batch(44, [300, 1, 0, 64], [0, 900, 5, 1500], LLAMA, padding=150)
    for splits in (1, 3):
        out = run(prefill.paged_attention_prefill, batch, 0, tile=prefill.parse_tile(name), splits=splits)
        assert not out.isnan().any()
        assert_matches_reference(out, batch, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4])
def test_llama_shapes_with_a_window_read_nothing_below_it(splits):
    batch = release_below_window(make_batch(41, [208, 64], [1840, 300], LLAMA, padding=16), 700)
    assert_matches_reference(run(prefill.paged_attention_prefill, batch, 700, splits=splits), batch, 700)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [None, "128x64x8x3", "h128x64x8x3", "h128x128x8x3", "c128x64x8x3", "hc128x64x8x3",
                                  "hct128x64x8x3"])
def test_llama_shapes_replay_in_a_cuda_graph_with_other_prefix_lengths(name):
    """Capture the op as served (None) or a tile of the sweep (those split here) once (its split count
    fixed from shapes); replay it with a step of the same token count but another cached prefix, row
    layout and padding, on consecutive pages (descriptor tiles take their descriptor path there): the
    runs follow the new spans."""
    first = make_batch(39, [200, 8], [1840, 0], LLAMA, padding=48)  # 256 tokens: a chunk capacity
    second = on_consecutive_pages(make_batch(40, [8, 200], [600, 1200], LLAMA, padding=48))
    capacity = max(first.poisoned[2].shape[1], second.poisoned[2].shape[1])
    pages = max(first.poisoned[0].shape[0], second.poisoned[0].shape[0])

    def widened(batch):
        k_cache, v_cache, table = batch.poisoned
        wide = torch.full((table.shape[0], capacity), k_cache.shape[0] - 1, dtype=torch.int32)  # the NaN page
        wide[:, : table.shape[1]] = table
        grown = [torch.cat([c, c[-1:].expand(pages - c.shape[0], *c.shape[1:])]) for c in (k_cache, v_cache)]
        return [t.cuda() for t in (batch.q, *grown, wide, batch.query_start, batch.positions)]

    inputs = widened(first)
    tile = prefill.parse_tile(name) if name else prefill.prefill_tile(128, torch.bfloat16, 256, 2)
    blocks, programs = 256 // tile.block_tokens(4) + 2, 32 // tile.heads_per_program(4)
    splits = prefill.prefill_splits(blocks, programs, capacity * 16, inputs[0].device, tile.min_split_tokens,
                                    max_splits=tile.max_splits)
    assert name is None or splits > 1  # the named tiles' split path runs (the served one's may not)

    def step():
        if name is None:
            return torch.ops.helios.paged_attention(*inputs, SCALE, 0)
        return prefill.paged_attention_prefill(*inputs, SCALE, 0, tile=prefill.parse_tile(name))

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
    for buffer, value in zip(inputs, widened(first)):  # fused combine: the counters re-armed themselves
        buffer.copy_(value)
    graph.replay()
    assert_matches_reference(out.cpu(), first, 0)

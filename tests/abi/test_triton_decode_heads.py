"""The decode kernel's partly wide programs (``kN`` tiles: N key/value heads a program, each tile
those heads' keys of its positions), its speculative first page entries (``s`` tiles) and its
output written without a zero fill (padding tokens get their zeros from the kernel), against the
CPU reference. Batches are the poisoned ones of
test_triton_attention; without CUDA the kernels run under Triton's interpreter. The GPU test replays
one captured graph over new spans at 8B shapes.
"""

from __future__ import annotations

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import triton_decode as decode
from test_triton_attention import Shape, assert_matches_reference, make_batch, run
from test_triton_decode import RAGGED, with_capacity
from test_triton_decode_combine import EIGHT_B, _graph_step, _load, counters_are_zero


@pytest.fixture
def nan_outputs(monkeypatch):
    """Outputs allocated by `torch.empty_like` start as NaN: an entry the kernel does not write shows."""
    empty_like = torch.empty_like

    def poisoned(tensor, *args, **kwargs):
        out = empty_like(tensor, *args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty_like", poisoned)


@pytest.mark.parametrize("heads, split, group, num_kv_heads, window, fused", [
    (2, 4, 4, 2, 0, True), (2, 1, 2, 3, 0, True), (4, 3, 2, 4, 9, True), (4, 4, 3, 3, 0, False),
    (2, 4, 1, 4, 9, False), (8, 1, 4, 2, 0, True)],
    ids=["k2-split", "k2-3heads-one-split", "k4-window", "k4-3heads-combine-launch", "k2-mha-window",
         "k8-past-the-heads"])
def test_partly_wide_programs_serve_their_heads_only(nan_outputs, heads, split, group, num_kv_heads, window,
                                                     fused):
    """A program of `heads` key/value heads (3 heads: the last program's second head is masked; more
    heads than the layer has: one program of all) and their query heads: split and unsplit, both
    combines, windows; a padding token and every other output entry are written by the kernel."""
    shape = Shape(group=group, num_kv_heads=num_kv_heads, page_tokens=4)
    batch = make_batch(47, [1] * 5, RAGGED, shape, padding=2)
    batch = base.release_below_window(batch, window) if window else batch
    tile = decode.DecodeTile(8, 4, 2, 16, fused_combine=fused, kv_heads=heads)
    out = run(decode.paged_attention_decode, batch, window, split=split, tile=tile)
    assert not torch.isnan(out).any()
    assert_matches_reference(out, batch, window)
    assert counters_are_zero()


@pytest.mark.parametrize("tile", [decode.DecodeTile(16, 4, 2, 16), decode.DecodeTile(8, 4, 2, 16, wide=True)],
                         ids=["narrow", "wide"])
@pytest.mark.parametrize("split", [1, 3])
def test_padding_tokens_get_zeros_from_the_kernel(nan_outputs, tile, split):
    """Tokens past the last row (and before a row of several tokens' end) read as exact zeros with no
    zero-filled output: the kernel's split 0 writes them."""
    batch = make_batch(48, [1, 2, 1], [5, 30, 0], Shape(page_tokens=8), padding=3)
    out = run(decode.paged_attention_decode, batch, 0, split=split, tile=tile)
    assert not torch.isnan(out).any()
    assert_matches_reference(out, batch, 0)


def test_tuned_launch_writes_every_entry(nan_outputs):
    batch = make_batch(49, [1] * 4, [3, 17, 40, 9], Shape(page_tokens=8), padding=1)
    splits = torch.tensor([3], dtype=torch.int32, device=base.DEVICE)
    out = run(decode.paged_attention_decode_tuned, batch, 0, splits=splits,
              tile=decode.DecodeTile(16, 4, 2, 16, kv_heads=2))
    assert not torch.isnan(out).any()
    assert_matches_reference(out, batch, 0)


SPECULATIVE = {"p1": decode.DecodeTile(8, 4, 2, 16, speculate=True),
               "p2-k2": decode.DecodeTile(8, 4, 2, 16, prefetch=2, kv_heads=2, speculate=True),
               "p1-wide-combine-launch": decode.DecodeTile(4, 4, 2, 16, False, wide=True, speculate=True)}


@pytest.mark.parametrize("tile_id", list(SPECULATIVE))
@pytest.mark.parametrize("layout, split, window", [("one-per-row", 1, 0), ("one-per-row", 4, 0),
                                                   ("one-per-row", 1, 9), ("empty-rows", 3, 0)])
def test_speculative_first_pages_hold_or_fall_back(nan_outputs, tile_id, layout, split, window):
    """The guessed row's first page entries are used only when the guess holds and the run starts at
    position 0: one token per row (the guess holds; later splits and windows start elsewhere) and empty
    rows with a padding token (the guess misses; the kernel loads the entries itself)."""
    if layout == "one-per-row":
        batch = make_batch(70, [1] * 5, RAGGED, Shape(page_tokens=4))
    else:
        batch = make_batch(71, [0, 1, 0, 1, 1, 0], [9, 40, 3, 0, 63, 12], Shape(page_tokens=4), padding=1)
    batch = base.release_below_window(batch, window) if window else batch
    out = run(decode.paged_attention_decode, batch, window, split=split, tile=SPECULATIVE[tile_id])
    assert not torch.isnan(out).any()
    assert_matches_reference(out, batch, window)
    assert counters_are_zero()


@pytest.mark.parametrize("fixed", [1, 3])
def test_a_fixed_split_count_replaces_the_tuned_one(monkeypatch, fixed):
    """A tile with `splits` launches that many splits (static: the count tensor is not read) on the
    tuned op, and the untuned op asks for it when no count is given; results stay exact."""
    launched = []
    launch = decode._launch

    def spy(out, tensors, scale, window, num_splits, splits, sinks, tile, *options):  # options: rotary, prefetch
        launched.append((num_splits, splits))
        return launch(out, tensors, scale, window, num_splits, splits, sinks, tile, *options)

    monkeypatch.setattr(decode, "_launch", spy)
    batch = make_batch(72, [1] * 5, RAGGED, Shape(page_tokens=4))
    tile = decode.DecodeTile(8, 4, 2, 16, kv_heads=2, splits=fixed)
    count = torch.tensor([5], dtype=torch.int32, device=base.DEVICE)
    assert_matches_reference(run(decode.paged_attention_decode_tuned, batch, 0, splits=count, tile=tile), batch, 0)
    assert_matches_reference(run(decode.paged_attention_decode, batch, 0, tile=tile), batch, 0)
    assert launched == [(fixed, None), (fixed, None)]
    assert counters_are_zero()


def test_heads_per_program_is_a_padded_power_of_two():
    assert decode.DecodeTile(kv_heads=4).heads_per_program(8) == 4
    assert decode.DecodeTile(kv_heads=4).heads_per_program(2) == 2  # no more than the padded head count
    assert decode.DecodeTile(kv_heads=2).heads_per_program(3) == 2
    assert decode.DecodeTile(wide=True).heads_per_program(3) == 4
    assert decode.DecodeTile().heads_per_program(8) == 1


def test_head_flags_parse_and_print():
    assert decode.DecodeTile.parse("32x4x2x128x1xk4") == decode.DecodeTile(32, 4, 2, 128, kv_heads=4)
    assert decode.DecodeTile.parse("16x2x3xk2") == decode.DecodeTile(16, 2, 3, kv_heads=2)
    assert decode.DecodeTile.parse("16x2x3x64x1xcxk2") == decode.DecodeTile(16, 2, 3, 64, False, kv_heads=2)
    assert decode.DecodeTile.parse("64x4x2x128x1xs") == decode.DecodeTile(64, 4, 2, 128, speculate=True)
    assert decode.DecodeTile.parse("16x4x2x128x1xk4xn2") == decode.DecodeTile(16, 4, 2, 128, kv_heads=4, splits=2)
    for tile in (decode.DecodeTile(32, 4, 2, 128, kv_heads=4), decode.DecodeTile(8, 4, 2, 32, False, 0, kv_heads=2),
                 decode.DecodeTile(16, 4, 2, 64, kv_heads=4, speculate=True),
                 decode.DecodeTile(16, 4, 2, 64, False, kv_heads=2, speculate=True, splits=3)):
        assert decode.DecodeTile.parse(tile.label) == tile
    for bad in ("32x4x2xk3", "32x4x2xk0", "32x4x2xwxk2", "32x4x2xk2xk2", "32x4x2xkk", "32x4x2xsxs", "32x4x2xn0"):
        with pytest.raises(ValueError, match="decode tile"):
            decode.DecodeTile.parse(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("batch_size, count, tile", [
    (64, 1, decode.DecodeTile(32, 4, 2, 64, kv_heads=2)), (64, 2, decode.DecodeTile(16, 4, 2, 64, kv_heads=4)),
    (256, 1, decode.DecodeTile(16, 2, 3, 64, kv_heads=4)), (1, 8, decode.DecodeTile(32, 4, 2, 32, kv_heads=2)),
    (64, 1, decode.DecodeTile(64, 4, 2, 128, speculate=True)),
    (256, 2, decode.DecodeTile(16, 4, 2, 128, kv_heads=4, speculate=True)),
], ids=["b64-k2", "b64-k4-split", "b256-k4", "b1-k2-split", "b64-speculate", "b256-k4-speculate-split"])
def test_partly_wide_programs_replay_new_spans_at_8b_shapes(batch_size, count, tile):
    """8B heads, contexts 1-1,500 in a 2,064-position capacity, two padding tokens: one graph
    captured and replayed over new positions and pages, each replay against the reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    spans = [[(97 * i + 611 * seed) % 1500 for i in range(batch_size)] for seed in (1, 2)]
    batches = [with_capacity(make_batch(60 + seed, [1] * batch_size, cached, EIGHT_B, padding=2), 129)
               for seed, cached in enumerate(spans)]
    inputs, graph, out = _graph_step(batches, tile, count)
    for batch in batches + batches[:1]:
        _load(inputs, batch)
        out.fill_(float("nan"))  # entries the kernel leaves unwritten would show
        graph.replay()
        assert_matches_reference(out.cpu(), batch, 0)
    assert counters_are_zero()

"""The Triton skinny matrix product (`helios.abi.triton_skinny`) against ``F.linear``, its table
(`helios.abi.gemv_tiles.SKINNY_TILES`), and the capture-time binding of a program's projections of
several rows to it (`helios.runtime.loading.gemv_calls`). Without CUDA the kernel runs under Triton's
interpreter.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import test_triton_attention  # noqa: F401  (enables the interpreter on machines without CUDA first)
from test_triton_gemv import _expected, _exported, _inputs, _targets  # the GEMV tests' inputs and graphs
from helios.abi import gemv_tiles
from helios.abi import triton_skinny
from helios.abi.gemv_tiles import GemvTile, SkinnyTile
from helios.runtime.loading.gemv_calls import bind_gemv, gemv_module


@pytest.mark.parametrize("rows, num_out, depth, tile", [
    (5, 64, 128, "16x32x32/1w4s2"), (16, 96, 256, "16x32x64/1w4s3"), (20, 96, 256, "16x32x32/4w4s2"),
    (40, 64, 128, "16x16x32/2w4s2"), (3, 32, 64, "32x32x16/4w2s2")],
    ids=["one-block", "full-block", "split-four-row-blocks", "split-three-row-blocks", "split-to-single-steps"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_matches_linear(rows, num_out, depth, tile, with_bias):
    """Rows fewer than, equal to and more than a block; the reduction whole or split; bias."""
    x, w, bias = _inputs(rows, num_out, depth)
    bias = bias if with_bias else None
    got = triton_skinny.skinny(x, w, bias, SkinnyTile.parse(tile))
    assert got.shape == (rows, num_out) and got.dtype == x.dtype
    torch.testing.assert_close(got.float().cpu(), _expected(x, w, bias).float().cpu(), rtol=1e-2, atol=1e-2)


def test_split_calls_give_the_same_bits_and_leave_the_counters_zero():
    """The last program of each tile adds the partials in split order and resets its counter: the
    next call (another input) starts from zero and the same input gives the same output."""
    tile = SkinnyTile.parse("16x32x32/4w4s2")
    x, w, _ = _inputs(20, 96, 256)
    first = triton_skinny.skinny(x, w, None, tile)
    other = triton_skinny.skinny(x.flip(0), w, None, tile)
    assert torch.equal(triton_skinny.skinny(x, w, None, tile), first)
    torch.testing.assert_close(other.float().cpu(), _expected(x.flip(0), w).float().cpu(), rtol=1e-2, atol=1e-2)
    assert not triton_skinny._COUNTERS[x.device].any()


def test_skinny_takes_leading_dimensions_and_strided_rows():
    x, w, _ = _inputs(8, 32, 64, torch.float16)
    strided = x[::2]  # rows two apart
    got = triton_skinny.skinny(strided.unsqueeze(0), w, None, SkinnyTile.parse("16x16x32/2w4s2"))
    assert got.shape == (1, 4, 32)
    torch.testing.assert_close(got[0].float().cpu(), _expected(strided, w).float().cpu(), rtol=1e-2, atol=1e-2)


def test_shapes_the_tile_does_not_fit_are_refused():
    x, w, _ = _inputs(4, 40, 64)
    with pytest.raises(ValueError, match="does not fit tile"):
        triton_skinny.skinny(x, w, None, SkinnyTile.parse("16x32x32/1w4s2"))  # 40 features: not whole blocks
    with pytest.raises(ValueError, match="does not fit tile"):
        triton_skinny.skinny(x[:, :48], w[:32, :48], None, SkinnyTile.parse("16x32x32/1w4s2"))  # 48 = 1.5 steps
    assert not triton_skinny.skinny_fits(4, 64, 64, SkinnyTile.parse("16x32x32/4w4s2"))  # 4 splits of 16


def test_counters_are_not_made_inside_a_capture(monkeypatch):
    monkeypatch.setattr(triton_skinny, "_COUNTERS", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="uncaptured call first"):
        triton_skinny._counters(torch.device("cuda"), 4)
    assert triton_skinny._counters(torch.device("cpu"), 4).numel() >= 4  # the host needs no capture rule


def test_skinny_linear_uses_the_table_and_falls_back_to_linear(monkeypatch):
    x, w, bias = _inputs(8, 32, 64)
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 32, 64): SkinnyTile.parse("16x16x32/2w4s2")})
    launched = []
    monkeypatch.setattr(triton_skinny, "skinny", lambda *a: launched.append(a) or F.linear(*a[:3]))
    triton_skinny.skinny_linear(x, w, bias)
    assert len(launched) == 1 and launched[0][3] == SkinnyTile.parse("16x16x32/2w4s2")
    too_many = torch.cat([x, x])  # 16 rows: the bucket of 9-16, no entry
    for args in ((too_many, w, bias), (x.float(), w.float()), (x[:, :32], w[:, :32]), (x[:1], w)):
        assert torch.equal(triton_skinny.skinny_linear(*args), F.linear(*args))
    assert len(launched) == 1


def test_committed_table_fits_its_shapes():
    """Each committed tile takes its own shapes (whole column blocks and reduction steps)."""
    for (rows, num_out, depth), tile in gemv_tiles.SKINNY_TILES.items():
        assert rows & (rows - 1) == 0 and triton_skinny.skinny_fits(rows, num_out, depth, tile)


def test_committed_gate_up_tiles_fuse_the_silu_mul():
    """Each committed tile of the 8B gate/up projection also carries the SiLU-mul in its epilogue
    (capture fuses it only where `silu_fits`; the step gains come with it), at every row count of
    its bucket."""
    entries = [(rows, tile) for (rows, num_out, depth), tile in gemv_tiles.SKINNY_TILES.items()
               if (num_out, depth) == (28672, 4096)]
    assert {rows for rows, _ in entries} >= {1, 4, 16, 64}
    for bucket, tile in entries:
        for rows in range(bucket // 2 + 1, bucket + 1):
            assert triton_skinny.silu_fits(rows, 28672, 4096, tile), (bucket, tile.label)


def test_table_rules(monkeypatch):
    small, large = SkinnyTile.parse("16x32x128/2w4s4"), SkinnyTile.parse("64x64x128/1w4s6")
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(16, 4096, 4096): small, (64, 4096, 4096): large})
    assert gemv_tiles.skinny_tile(9, 4096, 4096, torch.bfloat16) == small  # the bucket of 9-16 rows
    assert gemv_tiles.skinny_tile(16, 4096, 4096, torch.float16) == small
    assert gemv_tiles.skinny_tile(8, 4096, 4096, torch.bfloat16) is None  # 5-8: no entry
    assert gemv_tiles.skinny_tile(17, 4096, 4096, torch.bfloat16) is None  # 17-32: no entry
    assert gemv_tiles.skinny_tile(33, 4096, 4096, torch.bfloat16) == large
    assert gemv_tiles.skinny_tile(64, 4096, 4096, torch.bfloat16) == large
    assert gemv_tiles.skinny_tile(65, 4096, 4096, torch.bfloat16) is None
    assert gemv_tiles.skinny_tile(1, 4096, 4096, torch.bfloat16) is None  # one row: a bucket of its own
    monkeypatch.setitem(gemv_tiles.SKINNY_TILES, (1, 4096, 4096), small)
    assert gemv_tiles.skinny_tile(1, 4096, 4096, torch.bfloat16) == small
    assert gemv_tiles.skinny_tile(2, 4096, 4096, torch.bfloat16) is None
    assert gemv_tiles.skinny_tile(8, 4096, 4096, torch.float32) is None
    assert gemv_tiles.skinny_tile(8, 6144, 4096, torch.bfloat16) is None  # not in the table
    assert SkinnyTile.parse(large.label) == large
    for text in ("64x64x128", "64x64/1w4s4", "8x64x128/1w4s4", "64x64x128/0w4s4"):
        with pytest.raises(ValueError, match="skinny tile"):
            SkinnyTile.parse(text)


def test_capture_binds_the_tabled_projections_of_several_rows(monkeypatch):
    from helios.abi import triton_gemv

    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 96, 64): SkinnyTile.parse("16x32x32/2w4s2"),
                                                    (8, 48, 64): SkinnyTile.parse("16x16x64/1w4s2")})
    monkeypatch.setattr(gemv_tiles, "GEMV_TILES", {(96, 64): GemvTile(8, 32, 2)})  # one row only
    module, args = _exported(8)
    bound = gemv_module(module)
    assert _targets(bound).count(triton_skinny.skinny_linear) == 2  # qkv and out; the 80x64 keeps cuBLAS
    assert triton_gemv.gemv_linear not in _targets(bound)
    assert triton_skinny.skinny_linear not in _targets(module)  # the loaded module is left as it is
    for got, want in zip(bound(*args), module(*args)):
        torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=2e-2, atol=2e-2)
    one_row, one_row_args = _exported(1)
    assert _targets(gemv_module(one_row)).count(triton_gemv.gemv_linear) == 1  # the GEMV's table at one row
    monkeypatch.setitem(gemv_tiles.SKINNY_TILES, (1, 96, 64), SkinnyTile.parse("16x32x32/2w4s2"))
    monkeypatch.setitem(gemv_tiles.SKINNY_TILES, (1, 48, 64), SkinnyTile.parse("16x16x64/1w4s2"))
    bound = gemv_module(one_row)  # one row is a skinny bucket of its own; a GEMV entry is bound first
    assert _targets(bound).count(triton_gemv.gemv_linear) == _targets(bound).count(triton_skinny.skinny_linear) == 1
    for got, want in zip(bound(*one_row_args), one_row(*one_row_args)):
        torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=2e-2, atol=2e-2)
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {})
    module, _ = _exported(8)
    assert bind_gemv(module.graph) == 0 and gemv_module(module) is module


@pytest.mark.parametrize("rows, tile", [(1, "16x32x32/1w4s2"), (5, "16x32x32/1w4s2"), (20, "16x64x64/1w4s3")],
                         ids=["one-row", "one-block", "two-blocks"])
def test_skinny_silu_matches_the_projection_then_silu_mul(rows, tile):
    """The SiLU-mul in the product's epilogue: the two ops' result, within bfloat16 rounding (each
    product is rounded first, as the projection's output is; a tolerance cannot tell that rounding
    apart: the compiled kernels' GPU test compares against the two ops at 8B shapes too)."""
    x, w, _ = _inputs(rows, 2 * 96, 128)
    got = triton_skinny.skinny_silu(x, w, SkinnyTile.parse(tile))
    expected = torch.ops.helios.silu_mul(_expected(x, w).cpu())
    assert got.shape == (rows, 96) and got.dtype == x.dtype
    torch.testing.assert_close(got.float().cpu(), expected.float(), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="does not fit tile"):
        triton_skinny.skinny_silu(x, w, SkinnyTile.parse("16x32x32/2w4s2"))  # a split reduction
    assert not triton_skinny.silu_fits(rows, 2 * 96, 128, SkinnyTile.parse("16x128x32/1w4s2"))  # 96 = 1.5 x 64
    assert not triton_skinny.silu_fits(rows, 2 * 96, 128, SkinnyTile.parse("16x16x32/1w4s2"))  # halves of 8


class _Mlp(torch.nn.Module):
    def forward(self, x, gate_up, down):
        return F.linear(torch.ops.helios.silu_mul(F.linear(x, gate_up)), down)


def test_capture_fuses_the_silu_mul_into_a_tabled_gate_up_projection(monkeypatch):
    from helios.abi import fused  # noqa: F401  (registers helios::silu_mul)

    x, gate_up, _ = _inputs(8, 2 * 64, 64)
    down = _inputs(1, 64, 64, seed=1)[1]
    module = torch.export.export(_Mlp(), (x, gate_up, down), strict=False).module()
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 128, 64): SkinnyTile.parse("16x32x32/1w4s2")})
    bound = gemv_module(module)
    targets = _targets(bound)
    assert targets.count(triton_skinny.skinny_silu_linear) == 1
    assert torch.ops.helios.silu_mul.default not in targets and triton_skinny.skinny_linear not in targets
    assert targets.count(torch.ops.aten.linear.default) == 1  # the down projection: no tile
    torch.testing.assert_close(bound(x, gate_up, down).float().cpu(), module(x, gate_up, down).float().cpu(),
                               rtol=2e-2, atol=2e-2)
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 128, 64): SkinnyTile.parse("16x32x32/2w4s2")})
    split = _targets(gemv_module(module))  # a split tile: the projection alone, the SiLU-mul kept
    assert triton_skinny.skinny_linear in split and torch.ops.helios.silu_mul.default in split


def test_skinny_silu_linear_falls_back_to_the_two_ops(monkeypatch):
    """No tile, a tile the fused kernel does not take (a split reduction): the two ops themselves, bit
    for bit; three-dimensional x: the two ops too, whose SiLU-mul refuses it."""
    from helios.abi import fused  # noqa: F401  (registers helios::silu_mul)
    from helios.abi.registry import AbiArgumentError

    x, w, _ = _inputs(8, 2 * 64, 64)
    launched = []
    monkeypatch.setattr(triton_skinny, "skinny_silu", lambda *a: launched.append(a) or None)
    two_ops = torch.ops.helios.silu_mul(F.linear(x, w))
    for table in ({}, {(8, 128, 64): SkinnyTile.parse("16x32x32/2w4s2")}):
        monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", table)
        assert torch.equal(triton_skinny.skinny_silu_linear(x, w), two_ops)
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 128, 64): SkinnyTile.parse("16x32x32/1w4s2")})
    with pytest.raises(AbiArgumentError, match="gate_up must be"):
        triton_skinny.skinny_silu_linear(x.unsqueeze(0), w)
    assert not launched
    triton_skinny.skinny_silu_linear(x, w)
    assert len(launched) == 1


def test_operands_that_do_not_agree_are_refused_or_left_to_linear(monkeypatch):
    """A tabled shape with an x of another width, a bias of another length or dtype: the kernels
    refuse them (ValueError), `skinny_linear` leaves them to ``F.linear`` (which raises its own)."""
    x, w, bias = _inputs(8, 32, 64)
    tile = SkinnyTile.parse("16x16x32/1w4s2")
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 32, 64): tile, (8, 32, 32): tile})
    for args in ((x[:, :32], w, None), (x, w, bias[:16]), (x, w, bias.float())):
        with pytest.raises(ValueError, match="do not agree"):
            triton_skinny.skinny(*args, tile)
        with pytest.raises(RuntimeError):
            triton_skinny.skinny_linear(*args)
    with pytest.raises(ValueError, match="do not agree"):
        triton_skinny.skinny_silu(x[:, :32], w, SkinnyTile.parse("16x32x32/1w4s2"))


def test_counters_grown_keep_the_old_set_alive(monkeypatch):
    """A graph captured with the smaller set keeps its address: the set is never freed."""
    monkeypatch.setattr(triton_skinny, "_COUNTERS", {})
    monkeypatch.setattr(triton_skinny, "_OUTGROWN", [])
    first = triton_skinny._counters(torch.device("cpu"), 8)
    grown = triton_skinny._counters(torch.device("cpu"), 4096)
    assert grown.numel() >= 4096 and not grown.any() and triton_skinny._OUTGROWN == [first]
    assert triton_skinny._counters(torch.device("cpu"), 16) is grown


class _Twice(torch.nn.Module):
    def forward(self, x, gate_up, bias):
        product = F.linear(x, gate_up)
        return torch.ops.helios.silu_mul(product), product, torch.ops.helios.silu_mul(F.linear(x, gate_up, bias))


def test_capture_fuses_no_product_that_has_another_reader_or_a_bias(monkeypatch):
    from helios.abi import fused  # noqa: F401  (registers helios::silu_mul)

    x, gate_up, bias = _inputs(8, 2 * 64, 64)
    module = torch.export.export(_Twice(), (x, gate_up, bias), strict=False).module()
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 128, 64): SkinnyTile.parse("16x32x32/1w4s2")})
    targets = _targets(gemv_module(module))
    assert triton_skinny.skinny_silu_linear not in targets
    assert targets.count(triton_skinny.skinny_linear) == 2 and targets.count(torch.ops.helios.silu_mul.default) == 2


class _GeluMlp(torch.nn.Module):
    def forward(self, x, gate_up, down):
        return F.linear(torch.ops.helios.gelu_tanh_mul(F.linear(x, gate_up)), down)


def test_capture_fuses_no_gelu_tanh_mul(monkeypatch):
    """Gemma's gated GELU-tanh is not the SiLU-mul: its tabled gate/up projection runs on the skinny
    kernel alone and the activation stays ``helios::gelu_tanh_mul`` (the fused epilogue is SiLU's)."""
    from helios.abi import fused  # noqa: F401  (registers helios::gelu_tanh_mul)

    x, gate_up, _ = _inputs(8, 2 * 64, 64)
    down = _inputs(1, 64, 64, seed=1)[1]
    module = torch.export.export(_GeluMlp(), (x, gate_up, down), strict=False).module()
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 128, 64): SkinnyTile.parse("16x32x32/1w4s2")})
    bound = gemv_module(module)
    targets = _targets(bound)
    assert triton_skinny.skinny_silu_linear not in targets and triton_skinny.skinny_linear in targets
    assert targets.count(torch.ops.helios.gelu_tanh_mul.default) == 1
    torch.testing.assert_close(bound(x, gate_up, down).float().cpu(), module(x, gate_up, down).float().cpu(),
                               rtol=2e-2, atol=2e-2)

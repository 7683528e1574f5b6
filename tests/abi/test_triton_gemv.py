"""The Triton matrix-vector kernel (`helios.abi.triton_gemv`) against ``F.linear``, its table
(`helios.abi.gemv_tiles`), and the capture-time binding of a program's one-row projections to it
(`helios.runtime.loading.gemv_calls`). Without CUDA the kernel runs under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import gemv_tiles
from helios.abi import triton_gemv
from helios.abi.gemv_tiles import GemvTile
from helios.runtime.loading.gemv_calls import bind_gemv, gemv_module

DEVICE = base.DEVICE


def _inputs(rows: int, num_out: int, depth: int, dtype=torch.bfloat16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, depth, generator=generator).to(dtype)
    w = (0.05 * torch.randn(num_out, depth, generator=generator)).to(dtype)
    bias = torch.randn(num_out, generator=generator).to(dtype)
    return x.to(DEVICE), w.to(DEVICE), bias.to(DEVICE)


def _expected(x, w, bias=None):
    return F.linear(x.float(), w.float(), None if bias is None else bias.float()).to(x.dtype)


@pytest.mark.parametrize("rows, num_out, depth, tile", [
    (1, 40, 96, GemvTile(8, 32, 4)), (3, 24, 64, GemvTile(16, 64, 2)), (1, 17, 100, GemvTile(8, 64, 4)),
    (2, 9, 40, GemvTile(4, 512, 1))], ids=["one-row", "three-rows", "ragged-edges", "slice-past-depth"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_linear(rows, num_out, depth, tile, with_bias):
    """Any rows, out features not a multiple of block_n, depth not a multiple of block_k, bias."""
    x, w, bias = _inputs(rows, num_out, depth)
    bias = bias if with_bias else None
    got = triton_gemv.gemv(x, w, bias, tile)
    assert got.shape == (rows, num_out) and got.dtype == x.dtype
    torch.testing.assert_close(got.float().cpu(), _expected(x, w, bias).float().cpu(), rtol=1e-2, atol=1e-2)


def test_gemv_takes_leading_dimensions_and_strided_rows():
    x, w, _ = _inputs(4, 24, 64, torch.float16)
    strided = x[::2]  # rows two apart
    got = triton_gemv.gemv(strided.unsqueeze(0), w, tile=GemvTile(8, 32, 2))
    assert got.shape == (1, 2, 24)
    torch.testing.assert_close(got[0].float().cpu(), _expected(strided, w).float().cpu(), rtol=1e-2, atol=1e-2)


def test_gemv_linear_uses_the_table_and_falls_back_to_linear(monkeypatch):
    x, w, bias = _inputs(1, 24, 64)
    monkeypatch.setattr(gemv_tiles, "GEMV_TILES", {(24, 64): GemvTile(8, 32, 2)})
    launched = []
    monkeypatch.setattr(triton_gemv, "gemv", lambda *a: launched.append(a) or F.linear(*a[:3]))
    triton_gemv.gemv_linear(x, w, bias)
    assert len(launched) == 1 and launched[0][3] == GemvTile(8, 32, 2)
    two_rows = torch.cat([x, x])
    for args in ((two_rows, w, bias), (x.float(), w.float()), (x[:, :32], w[:, :32])):  # rows, dtype, shape
        assert torch.equal(triton_gemv.gemv_linear(*args), F.linear(*args))
    assert len(launched) == 1


def test_table_rules(monkeypatch):
    monkeypatch.setattr(gemv_tiles, "GEMV_TILES", {(6144, 4096): GemvTile(4, 512, 4)})
    assert gemv_tiles.gemv_tile(1, 6144, 4096, torch.bfloat16) == GemvTile(4, 512, 4)
    assert gemv_tiles.gemv_tile(1, 6144, 4096, torch.float16) is not None
    assert gemv_tiles.gemv_tile(2, 6144, 4096, torch.bfloat16) is None  # past MAX_ROWS
    assert gemv_tiles.gemv_tile(1, 6144, 4096, torch.float32) is None
    assert gemv_tiles.gemv_tile(1, 28672, 4096, torch.bfloat16) is None  # not in the table
    assert GemvTile.parse("16x256x8") == GemvTile(16, 256, 8) and GemvTile.parse(GemvTile().label) == GemvTile()
    with pytest.raises(ValueError, match="gemv tile"):
        GemvTile.parse("8x512")


class _Projections(torch.nn.Module):
    def forward(self, x, qkv, out, mlp):
        return F.linear(F.linear(x, qkv)[..., :64], out), F.linear(x, mlp)


def _exported(rows: int):
    x, qkv, _ = _inputs(rows, 96, 64)
    weights = (qkv, _inputs(1, 48, 64)[1], _inputs(1, 80, 64)[1])
    module = torch.export.export(_Projections(), (x.unsqueeze(0), *weights), strict=False).module()
    return module, (x.unsqueeze(0), *weights)


def _targets(module) -> list:
    return [node.target for node in module.graph.nodes if node.op == "call_function"]


def test_capture_binds_the_tabled_one_row_projections_only(monkeypatch):
    monkeypatch.setattr(gemv_tiles, "GEMV_TILES", {(96, 64): GemvTile(8, 32, 2), (48, 64): GemvTile(16, 64, 4)})
    module, args = _exported(1)
    bound = gemv_module(module)
    assert bound is not module
    assert _targets(bound).count(triton_gemv.gemv_linear) == 2  # qkv and out; the 80x64 keeps cuBLAS
    assert _targets(bound).count(torch.ops.aten.linear.default) == 1
    assert triton_gemv.gemv_linear not in _targets(module)  # the loaded module is left as it is
    for got, want in zip(bound(*args), module(*args)):
        torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=2e-2, atol=2e-2)


def test_capture_keeps_cublas_without_a_tile(monkeypatch):
    monkeypatch.setattr(gemv_tiles, "GEMV_TILES", {(96, 64): GemvTile(8, 32, 2)})
    module, _ = _exported(2)  # two rows: past MAX_ROWS
    assert gemv_module(module) is module
    monkeypatch.setattr(gemv_tiles, "GEMV_TILES", {})
    module, _ = _exported(1)
    assert bind_gemv(module.graph) == 0 and gemv_module(module) is module

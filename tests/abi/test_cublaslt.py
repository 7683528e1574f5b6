"""cuBLASLt's chosen algorithms (`helios.abi.cublaslt`) and their capture-time binding and load-time
choice (`helios.runtime.loading.gemm_algos`), on the CPU: which projections are bound, that a bound
call is ``F.linear`` wherever no algorithm is registered or the operands do not fit one, and how a
shape's failed timing is kept. The device side is `tests/gpu/test_cublaslt_cuda.py`.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import test_triton_attention  # noqa: F401  (enables the interpreter on machines without CUDA first)
from test_triton_gemv import _exported, _targets
from helios.abi import cublaslt, gemv_tiles
from helios.abi.gemv_tiles import SkinnyTile
from helios.runtime.loading import cuda_graphs, gemm_algos
from helios.runtime.loading.gemv_calls import gemv_module

LINEAR = torch.ops.aten.linear.default


@pytest.fixture
def opened(monkeypatch):
    """cuBLASLt reported as opened and the choice on, so the binding can be tested without a device."""
    monkeypatch.setattr(cublaslt, "available", lambda: True)
    monkeypatch.setattr(gemm_algos, "ENABLED", True)


def test_eligible_projections_are_bound_and_compute_linear_without_a_choice(opened):
    module, args = _exported(8)
    bound = gemv_module(module)
    assert _targets(bound).count(cublaslt.lt_linear) == 3 and LINEAR not in _targets(bound)
    assert cublaslt.lt_linear not in _targets(module)  # the loaded module is left as it is
    for got, want in zip(bound(*args), module(*args)):
        assert torch.equal(got, want)  # nothing registered (and a CPU tensor): F.linear itself
    assert gemm_algos.lt_shapes([bound, module, object()]) == {
        (8, 96, 64, torch.bfloat16), (8, 48, 64, torch.bfloat16), (8, 80, 64, torch.bfloat16)}


def test_what_is_not_bound(opened, monkeypatch):
    one_row, _ = _exported(1)
    assert gemv_module(one_row) is one_row  # one row: cuBLAS's GEMV pick stays
    monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(8, 96, 64): SkinnyTile.parse("16x32x32/2w4s2")})
    from helios.abi import triton_skinny

    targets = _targets(gemv_module(_exported(8)[0]))
    assert targets.count(triton_skinny.skinny_linear) == 1 and targets.count(cublaslt.lt_linear) == 2
    monkeypatch.setattr(gemm_algos, "MAX_ROWS", 4)
    assert _targets(gemv_module(_exported(8)[0])).count(cublaslt.lt_linear) == 0  # past MAX_ROWS
    monkeypatch.setattr(gemm_algos, "MAX_ROWS", 256)
    monkeypatch.setattr(gemm_algos, "ENABLED", False)
    module, _ = _exported(8)
    assert cublaslt.lt_linear not in _targets(gemv_module(module))


class _Biased(torch.nn.Module):
    def forward(self, x, w, b):
        return F.linear(x, w, b), F.linear(x.float(), w.float())


def test_biased_and_float32_projections_keep_linear(opened):
    x, w, b = torch.randn(8, 64).bfloat16(), torch.randn(32, 64).bfloat16(), torch.randn(32).bfloat16()
    module = torch.export.export(_Biased(), (x, w, b), strict=False).module()
    assert gemv_module(module) is module


def test_unavailable_library_binds_nothing_and_refuses_a_product(monkeypatch):
    monkeypatch.setattr(gemm_algos, "ENABLED", True)
    if cublaslt.available():
        pytest.skip("a CUDA device with cuBLASLt: tests/gpu/test_cublaslt_cuda.py covers it")
    module, _ = _exported(8)
    assert gemv_module(module) is module
    with pytest.raises(cublaslt.CublasLtError, match="not available"):
        cublaslt.LtProduct(8, 96, 64, torch.bfloat16)


def test_lt_linear_is_linear_where_nothing_fits(monkeypatch):
    x, w, b = torch.randn(2, 4, 64).bfloat16(), torch.randn(32, 64).bfloat16(), torch.randn(32).bfloat16()
    monkeypatch.setitem(cublaslt._CHOSEN, (None, 8, 32, 64, torch.bfloat16), ("product", "algo"))
    for args in ((x, w), (x, w, b), (x.float(), w.float())):
        assert torch.equal(cublaslt.lt_linear(*args), F.linear(*args))  # CPU tensors, bias, dtype
    with pytest.raises(RuntimeError, match="at least 1D"):  # what F.linear says of a scalar
        cublaslt.lt_linear(torch.tensor(1.0), w)
    monkeypatch.setattr(cublaslt, "ENABLED", False)
    assert torch.equal(cublaslt.lt_linear(x, w), F.linear(x, w))


def test_a_failed_timing_keeps_linear_and_is_not_repeated(monkeypatch, caplog):
    calls = []

    def failing(shape, device):
        calls.append(shape)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(gemm_algos, "_time_shape", failing)
    monkeypatch.setattr(gemm_algos, "_DONE", {})
    device = torch.device("cuda", 0)
    shape = (64, 4096, 4096, torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger=gemm_algos.__name__):
        first = gemm_algos.choose_algorithms({shape}, device)
    again = gemm_algos.choose_algorithms({shape}, device)
    assert calls == [shape] and first == again
    assert first[0].label is None and first[0].gain == 1.0
    assert "left on F.linear: out of memory" in caplog.text


def test_choice_gain():
    assert gemm_algos.Choice((64, 1, 1, torch.bfloat16), 10.0, 8.0, "#1").gain == 1.25
    assert gemm_algos.Choice((64, 1, 1, torch.bfloat16), 10.0, None, None).gain == 1.0


def test_no_timing_for_a_cpu_load(monkeypatch):
    monkeypatch.setattr(gemm_algos, "_time_shape", lambda *a: pytest.fail("timed on the CPU"))
    cuda_graphs.choose_gemm_algorithms(cuda_graphs.CapturePlans({}), torch.device("cpu"))


def test_off_by_default_binds_nothing(monkeypatch):
    monkeypatch.setattr(cublaslt, "available", lambda: True)
    module, _ = _exported(8)
    assert not gemm_algos.ENABLED and gemv_module(module) is module

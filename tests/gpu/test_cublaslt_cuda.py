"""cuBLASLt's algorithms on CUDA (`helios.abi.cublaslt`, `helios.runtime.loading.gemm_algos`): every
candidate the heuristic offers computes ``F.linear`` within bfloat16 rounding; a registered choice
runs without synchronising, inside a replayed CUDA graph with the same bits as eagerly; operands it
does not fit go to ``F.linear``; the load-time timing registers what it reports.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helios.abi import cublaslt
from helios.runtime.loading import gemm_algos

from support.cuda_calls import capture, without_sync

pytestmark = pytest.mark.gpu


def _operands(rows: int, num_out: int, depth: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, depth, generator=generator).to(torch.bfloat16).cuda()
    weight = (torch.randn(num_out, depth, generator=generator) / depth ** 0.5).to(torch.bfloat16).cuda()
    return x, weight


@pytest.mark.parametrize("rows, num_out, depth", [(64, 4096, 4096), (256, 1024, 4096), (7, 384, 256)])
def test_every_candidate_computes_linear(rows, num_out, depth):
    x, weight = _operands(rows, num_out, depth)
    product = cublaslt.LtProduct(rows, num_out, depth, torch.bfloat16)
    candidates = product.candidates()
    assert candidates and len({c.algo for c in candidates}) == len(candidates)
    expected = F.linear(x.float(), weight.float())
    for algo in candidates:
        got = product.run(x, weight, algo)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, num_out)
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)


def test_a_registered_choice_replays_in_a_graph_with_its_eager_bits(monkeypatch):
    rows, num_out, depth = 64, 2048, 4096
    x, weight = _operands(rows, num_out, depth, seed=1)
    product = cublaslt.LtProduct(rows, num_out, depth, torch.bfloat16)
    algo = product.candidates()[-1]
    monkeypatch.setattr(cublaslt, "_CHOSEN", {})
    cublaslt.choose(product, algo)
    assert cublaslt.chosen(x.device.index, rows, num_out, depth, torch.bfloat16) == algo
    eager = without_sync(lambda: cublaslt.lt_linear(x.unsqueeze(0), weight))
    assert eager.shape == (1, rows, num_out) and torch.equal(eager[0], product.run(x, weight, algo))
    graph, captured = capture(lambda: cublaslt.lt_linear(x, weight))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager[0])
    offset = torch.empty(rows * depth + 8, dtype=torch.bfloat16, device="cuda")[8:].view(rows, depth)
    offset.copy_(x)  # 16 bytes past an aligned block: not what the algorithm was chosen for
    assert torch.equal(cublaslt.lt_linear(offset, weight), F.linear(offset, weight))
    cublaslt.choose(product, None)
    assert cublaslt.chosen(x.device.index, rows, num_out, depth, torch.bfloat16) is None


@pytest.mark.parametrize("sustain_ms", [0.0, 5.0])
def test_load_time_choice_registers_what_it_reports(monkeypatch, sustain_ms):
    monkeypatch.setattr(cublaslt, "_CHOSEN", {})
    monkeypatch.setattr(gemm_algos, "_DONE", {})
    monkeypatch.setattr(gemm_algos, "MIN_GAIN", 0.0)  # every shape keeps its fastest candidate
    monkeypatch.setattr(gemm_algos, "SUSTAIN_MS", sustain_ms)  # single replays, or back-to-back ones
    device = torch.device("cuda", torch.cuda.current_device())
    shapes = {(32, 1024, 2048, torch.bfloat16), (64, 4096, 1024, torch.float16)}
    choices = gemm_algos.choose_algorithms(shapes, device)
    assert {c.shape for c in choices} == shapes
    for choice in choices:
        assert choice.f_linear_us > 0 and choice.chosen_us > 0 and choice.label
        assert cublaslt.chosen(device.index, *choice.shape).label == choice.label
    x, weight = _operands(32, 1024, 2048, seed=2)
    torch.testing.assert_close(cublaslt.lt_linear(x, weight).float(), F.linear(x.float(), weight.float()),
                               rtol=2e-2, atol=2e-2)

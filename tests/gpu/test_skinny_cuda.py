"""The skinny matrix product (`helios.abi.triton_skinny.skinny_linear`, and `skinny_silu_linear`
with the SiLU-mul in its epilogue) on CUDA where the table names a tile: ``F.linear``'s result on
the CPU (within bfloat16 rounding), no synchronisation, and inside a replayed CUDA graph, where the
split reduction's tile counters must be back at zero after every replay (a counter left behind
would make the next replay's tiles finish early, with partial sums).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helios.abi import gemv_tiles, triton_skinny
from helios.abi.gemv_tiles import SkinnyTile

from gpu.test_ops_cuda import load
from support.cuda_calls import capture, to_cuda, without_sync

pytestmark = pytest.mark.gpu

CASES = {  # (rows, out, in, tile or None for the committed table's)
    "split-four": (64, 512, 1024, SkinnyTile.parse("64x32x128/4w4s4")),
    "split-two-partial-rows": (40, 256, 2048, SkinnyTile.parse("64x64x128/2w4s4")),
    "committed-gate-up": (64, 28672, 4096, None),
    "committed-down": (64, 4096, 14336, None),
    "committed-output": (64, 4096, 4096, None),
    "committed-one-row-qkv": (1, 6144, 4096, None),
    "committed-one-row-output": (1, 4096, 4096, None),
    "committed-one-row-gate-up": (1, 28672, 4096, None),
    "committed-one-row-down-split": (1, 4096, 14336, None),
    "committed-four-rows-qkv-partial": (3, 6144, 4096, None),
    "committed-four-rows-output": (4, 4096, 4096, None),
    "committed-four-rows-gate-up": (4, 28672, 4096, None),
    "committed-four-rows-down-split": (4, 4096, 14336, None),
    "committed-sixteen-rows-qkv": (16, 6144, 4096, None),
    "committed-sixteen-rows-output-partial": (12, 4096, 4096, None),
    "committed-sixteen-rows-gate-up": (16, 28672, 4096, None),
    "committed-sixteen-rows-down": (16, 4096, 14336, None),
}


def _inputs(rows: int, num_out: int, depth: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, depth, generator=generator).to(torch.bfloat16)
    weight = (torch.randn(num_out, depth, generator=generator) / depth ** 0.5).to(torch.bfloat16)
    return {"x": x, "weight": weight}


def _compare(actual, expected) -> None:
    assert actual.device.type == "cuda" and actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", list(CASES))
def test_skinny_linear_in_a_graph(case, monkeypatch):
    rows, num_out, depth, tile = CASES[case]
    if tile is not None:
        bucket = 1 << (rows - 1).bit_length()
        monkeypatch.setattr(gemv_tiles, "SKINNY_TILES", {(bucket, num_out, depth): tile})
    assert gemv_tiles.skinny_tile(rows, num_out, depth, torch.bfloat16) is not None
    launched = []
    real = triton_skinny.skinny
    monkeypatch.setattr(triton_skinny, "skinny", lambda *a: launched.append(a[3]) or real(*a))
    make = lambda seed: _inputs(rows, num_out, depth, seed)  # noqa: E731
    _compare(triton_skinny.skinny_linear(**to_cuda(make(0))), F.linear(**make(0)))
    assert launched, "the table's tile was not used"
    static = to_cuda(make(1))
    _compare(without_sync(lambda: triton_skinny.skinny_linear(**static)), F.linear(**make(1)))
    graph, output = capture(lambda: triton_skinny.skinny_linear(**static))
    replayed = []
    for seed in (2, 3, 3):
        fresh = make(seed)
        load(static, fresh)
        graph.replay()
        torch.cuda.synchronize()
        _compare(output, F.linear(**fresh))
        replayed.append(output.clone())
    assert torch.equal(replayed[1], replayed[2]), "the same inputs gave other bits"
    if (tile or gemv_tiles.skinny_tile(rows, num_out, depth, torch.bfloat16)).split_k > 1:
        assert not triton_skinny._COUNTERS[torch.device("cuda", torch.cuda.current_device())].any()


@pytest.mark.parametrize("rows", [64, 16, 3, 1])
def test_skinny_silu_linear_in_a_graph(rows):
    """The committed gate/up tiles with the SiLU-mul fused: the two ops' result on the CPU."""
    from helios.abi import fused  # noqa: F401  (registers helios::silu_mul)

    num_out, depth = 28672, 4096
    tile = gemv_tiles.skinny_tile(rows, num_out, depth, torch.bfloat16)
    assert tile is not None and triton_skinny.silu_fits(rows, num_out, depth, tile)
    two_ops = lambda inputs: torch.ops.helios.silu_mul(F.linear(**inputs))  # noqa: E731
    make = lambda seed: _inputs(rows, num_out, depth, seed)  # noqa: E731
    _compare(triton_skinny.skinny_silu_linear(**to_cuda(make(0))), two_ops(make(0)))
    static = to_cuda(make(1))
    graph, output = capture(lambda: triton_skinny.skinny_silu_linear(**static))
    fresh = make(2)
    load(static, fresh)
    graph.replay()
    torch.cuda.synchronize()
    _compare(output, two_ops(fresh))


def _layer_chain(hidden, weights):
    """add + RMSNorm, the gate/up product with the SiLU-mul, the down product, per layer: each
    kernel reads what the one before it wrote (a race under dependent launch would show here)."""
    from helios.abi.triton_fused import triton_rms_norm

    gate_up, down = (SkinnyTile.parse(label) for label in ("64x128x128/1w8s4", "64x32x128/1w4s6"))
    delta = torch.zeros_like(hidden)
    for norm, up_weight, down_weight in weights:
        hidden, normed = triton_rms_norm(hidden, delta, norm, 1e-5)
        delta = triton_skinny.skinny(triton_skinny.skinny_silu(normed, up_weight, gate_up), down_weight, None, down)
    return hidden + delta


def test_dependent_launch_keeps_the_bits(monkeypatch):
    """The norm and skinny kernels launched with programmatic dependent launch (on this Hopper
    device by default) give the bits they give without it, eagerly and in replayed graphs."""
    from helios.abi import dependent_launch

    assert dependent_launch.dependent_launch(torch.zeros(1, device="cuda"))
    generator = torch.Generator().manual_seed(5)
    width, hidden_width = 2048, 1024
    weights = [(torch.ones(hidden_width, dtype=torch.bfloat16),
                (torch.randn(2 * width, hidden_width, generator=generator) / hidden_width ** 0.5).to(torch.bfloat16),
                (torch.randn(hidden_width, width, generator=generator) / width ** 0.5).to(torch.bfloat16))
               for _ in range(6)]
    weights = [tuple(t.cuda() for t in layer) for layer in weights]
    initial = torch.randn(64, hidden_width, generator=generator).to(torch.bfloat16)
    static = initial.cuda()
    results = {}
    for enabled in (False, True):
        monkeypatch.setattr(dependent_launch, "ENABLED", enabled)
        eager = _layer_chain(static, weights)
        graph, output = capture(lambda: _layer_chain(static, weights))
        replays = []
        for seed in (6, 7):
            static.copy_(torch.randn(64, hidden_width, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
            graph.replay()
            replays.append(output.clone())
        torch.cuda.synchronize()
        results[enabled] = (eager, *replays)
        static.copy_(initial)  # the next side's eager call and capture start from the same input
    for without, with_pdl in zip(results[False], results[True]):
        assert torch.equal(without, with_pdl)
    assert not torch.equal(results[True][1], results[True][2])

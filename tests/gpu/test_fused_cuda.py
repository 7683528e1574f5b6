"""The fused decoder ops and the greedy sampling kernel on CUDA: their CPU references' results,
no synchronisation, and the same results from a replayed CUDA graph.

For each op: (1) CUDA gives the CPU reference's result (greedy tokens exactly, float results within
one bfloat16 rounding or float32 reduction-order rounding); (2) a second call runs under
``torch.cuda.set_sync_debug_mode("error")``; (3) the call is captured into a CUDA graph, new
values are copied into the static inputs, and replays give the reference's results for them.
"""

from __future__ import annotations

import pytest
import torch

from helios.abi.sampling import SampleVariant
from support.abi_inputs import sample_inputs

from gpu.test_ops_cuda import capture, load, to_cuda, without_sync

pytestmark = pytest.mark.gpu
OPS = torch.ops.helios
DEVICE = "cuda"
TOLERANCE = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _random(shape, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * 2).to(dtype)


def _close(dtype):
    def compare(actual, expected):
        actual = actual if isinstance(actual, (tuple, list)) else (actual,)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        for got, want in zip(actual, expected):
            assert got.device.type == DEVICE and got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, **TOLERANCE[dtype])
    return compare


def check_in_graph(op, make, compare) -> None:
    function = getattr(OPS, op) if isinstance(op, str) else op
    compare(function(**to_cuda(make(0))), function(**make(0)))
    static = to_cuda(make(1))
    compare(without_sync(lambda: function(**static)), function(**make(1)))
    graph, outputs = capture(lambda: function(**static))
    for seed in (2, 3):
        fresh = make(seed)
        load(static, fresh)
        graph.replay()
        torch.cuda.synchronize()
        compare(outputs, function(**fresh))


@pytest.mark.parametrize("rows,vocab", [(1, 128256), (64, 128256), (256, 32000), (7, 151936)])
def test_greedy_sample_kernel_in_a_graph(rows, vocab):
    """In the greedy variant every row's token is its greedy one: bit for bit the CPU pipeline's."""
    make = lambda seed: sample_inputs(rows, vocab, seed=1000 * rows + seed)  # noqa: E731
    check_in_graph(SampleVariant.GREEDY, make,
                   lambda a, e: torch.equal(a.cpu(), e) or pytest.fail(f"{a.cpu()} != {e}"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 4096), (64, 4096), (300, 896)])
def test_rms_norm_ops_in_a_graph(dtype, rows, width):
    def norm(seed):
        return dict(x=_random((rows, width), dtype, seed), weight=_random((width,), dtype, seed + 50), eps=1e-5)

    def add_norm(seed):
        return dict(norm(seed), delta=_random((rows, width), dtype, seed + 90))
    check_in_graph("rms_norm", norm, _close(dtype))
    check_in_graph("add_rms_norm", add_norm, _close(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_of_heads_in_a_graph(dtype):  # qk-norm: [T, H, D] with a [D] weight
    check_in_graph("rms_norm", lambda seed: dict(x=_random((9, 16, 128), dtype, seed),
                                                 weight=_random((128,), dtype, seed + 1), eps=1e-6), _close(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 14336), (64, 14336), (200, 1000)])
def test_silu_mul_in_a_graph(dtype, rows, width):
    check_in_graph("silu_mul", lambda seed: dict(gate_up=_random((rows, 2 * width), dtype, seed)), _close(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(512, 14336), (130, 1000)])
def test_silu_mul_of_a_column_major_product_in_a_graph(dtype, rows, width):
    """The swapped gate/up product's transpose (column-major) is read in place by its own kernel."""
    def make(seed):
        return dict(gate_up=_random((2 * width, rows), dtype, seed).t())
    assert to_cuda(make(0))["gate_up"].stride() == (1, rows)  # the column-major kernel's input
    check_in_graph("silu_mul", make, _close(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 10240), (64, 10240), (200, 1000)])
def test_gelu_tanh_mul_in_a_graph(dtype, rows, width):
    """Gemma's gated GELU-tanh (the torch composite on the device) in a CUDA graph."""
    check_in_graph("gelu_tanh_mul", lambda seed: dict(gate_up=_random((rows, 2 * width), dtype, seed)), _close(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width,bias", [(1, 8192, False), (64, 4096, True), (300, 896, True)])
def test_layer_norm_in_a_graph(dtype, rows, width, bias):
    """Cohere's / StarCoder2's LayerNorm (the torch composite on the device) in a CUDA graph."""
    def make(seed):
        return dict(x=_random((rows, width), dtype, seed), weight=_random((width,), dtype, seed + 50),
                    bias=_random((width,), dtype, seed + 90) if bias else None, eps=1e-5)
    check_in_graph("layer_norm", make, _close(dtype))


def rotary_inputs(tokens: int, heads: tuple[int, int], head_dim: int, dtype, seed: int) -> dict:
    """q, k, v as views of one fused projection, decoder cos/sin, distinct slots (a few padding)."""
    num_heads, num_kv_heads = heads
    qkv = _random((tokens, (num_heads + 2 * num_kv_heads) * head_dim), dtype, seed)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4000, (tokens,), generator=generator)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    pages, page_tokens = 2 * tokens // 16 + 2, 16
    slots = torch.randperm(pages * page_tokens, generator=generator)[:tokens]
    slots[::5] = -1
    cache = torch.zeros((pages, page_tokens, num_kv_heads, head_dim), dtype=dtype)
    return dict(q=q.reshape(tokens, num_heads, head_dim), k=k.reshape(tokens, num_kv_heads, head_dim),
                v=v.reshape(tokens, num_kv_heads, head_dim), cos=angles.cos().to(dtype)[:, None, :],
                sin=angles.sin().to(dtype)[:, None, :], k_cache=cache, v_cache=cache.clone(), slot_mapping=slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,heads,head_dim", [(1, (32, 8), 128), (64, (32, 8), 128), (300, (14, 2), 64)])
def test_rotary_cache_write_in_a_graph(dtype, tokens, heads, head_dim):
    make = lambda seed: rotary_inputs(tokens, heads, head_dim, dtype, seed)  # noqa: E731
    compare = _close(dtype)

    def run(inputs):  # the rotated q, then both cache planes
        return OPS.rotary_cache_write(**inputs), inputs["k_cache"], inputs["v_cache"]
    expected, on_cuda = make(0), to_cuda(make(0))
    compare(run(on_cuda), run(expected))
    static = to_cuda(make(1))
    compare(without_sync(lambda: run(static)), run(make(1)))
    graph, outputs = capture(lambda: OPS.rotary_cache_write(**static))
    for seed in (2, 3):
        torch.cuda.synchronize()
        fresh = dict(make(seed), k_cache=static["k_cache"].cpu(), v_cache=static["v_cache"].cpu())
        load(static, fresh, names=("q", "k", "v", "cos", "sin", "slot_mapping"))
        graph.replay()
        torch.cuda.synchronize()
        compare((outputs, static["k_cache"], static["v_cache"]), run(fresh))

"""The fused decoder ops of `helios.abi.fused`: CPU references equal the former torch sequences bit
for bit, and the Triton kernels (interpreted on the CPU, compiled on CUDA) agree with them.

Without CUDA the kernels run under Triton's interpreter (`enable_interpreter` sets TRITON_INTERPRET=1
before triton is first imported). Rounding: the kernels round where the reference rounds, so
float32 agrees to ~1e-6 and bfloat16 to one unit in the last place at most.
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi import fused  # noqa: E402
from helios.abi.registry import AbiArgumentError  # noqa: E402
from helios.abi.triton_fused import triton_rms_norm, triton_rotary_cache_write, triton_silu_mul  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
OPS = torch.ops.helios
DTYPES = (torch.float32, torch.bfloat16)
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _random(shape, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * 2).to(dtype)


def _former_rms_norm(x, weight, eps):  # the decoder's body before the op existed
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(5, 64), (3, 100)])
def test_rms_norm_and_add_rms_norm(dtype, rows, width):
    x, delta, weight = _random((rows, width), dtype, 0), _random((rows, width), dtype, 1), _random((width,), dtype, 2)
    expected = _former_rms_norm(x, weight, 1e-5)
    assert torch.equal(OPS.rms_norm(x, weight, 1e-5), expected)
    summed, normed = OPS.add_rms_norm(x, delta, weight, 1e-5)
    assert torch.equal(summed, x + delta) and torch.equal(normed, _former_rms_norm(x + delta, weight, 1e-5))
    _, kernel = triton_rms_norm(x.to(DEVICE), None, weight.to(DEVICE), 1e-5)
    torch.testing.assert_close(kernel.cpu(), expected, **TOLERANCE[dtype])
    kernel_sum, kernel_norm = triton_rms_norm(x.to(DEVICE), delta.to(DEVICE), weight.to(DEVICE), 1e-5)
    assert torch.equal(kernel_sum.cpu(), summed)  # one rounded add: exact
    torch.testing.assert_close(kernel_norm.cpu(), normed, **TOLERANCE[dtype])


def test_rms_norm_of_strided_heads():
    qkv = _random((3, 6 * 16), torch.float32, 3)
    q = qkv[:, :4 * 16].reshape(3, 4, 16)  # a strided split view, as qk-norm sees it
    weight = _random((16,), torch.float32, 4)
    _, kernel = triton_rms_norm(q.to(DEVICE), None, weight.to(DEVICE), 1e-6)
    torch.testing.assert_close(kernel.cpu(), _former_rms_norm(q, weight, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gate_up = _random((4, 2 * 1500), dtype, 5)
    gate, up = gate_up.split([1500, 1500], dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    assert torch.equal(OPS.silu_mul(gate_up), expected)
    torch.testing.assert_close(triton_silu_mul(gate_up.to(DEVICE)).cpu(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(70, 100), (5, 64), (2, 3)])
def test_silu_mul_of_a_column_major_product(dtype, rows, width):
    """The swapped gate/up product (w @ x^T, transposed back to [N, 2F]) is read in place: the same
    values as the row-major kernel, row-major out, partial blocks masked."""
    product = _random((2 * width, rows), dtype, 6)  # [2F, N] contiguous
    gate_up = product.t()  # [N, 2F], column-major
    assert gate_up.stride(0) == 1 and not gate_up.is_contiguous()
    gate, up = gate_up.split([width, width], dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    assert torch.equal(OPS.silu_mul(gate_up), expected)
    got = triton_silu_mul(gate_up.to(DEVICE))
    assert got.is_contiguous() and got.shape == (rows, width)
    torch.testing.assert_close(got.cpu(), expected, **TOLERANCE[dtype])
    torch.testing.assert_close(got, triton_silu_mul(gate_up.contiguous().to(DEVICE)), rtol=0, atol=0)


def _rotary_case(dtype, num_tokens=5, heads=(12, 3), head_dim=16, pages=4, page_tokens=4):
    """q, k, v as strided views of one fused projection; cos/sin as the decoder builds them; slots
    with one padding token (-1)."""
    num_heads, num_kv_heads = heads
    qkv = _random((num_tokens, (num_heads + 2 * num_kv_heads) * head_dim), dtype, 6)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k, v = (t.reshape(num_tokens, -1, head_dim) for t in (q, k, v))
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.arange(3, 3 + num_tokens).float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]
    slots = torch.tensor([9, 2, -1, 15, 0][:num_tokens], dtype=torch.int64)
    cache = torch.zeros((pages, page_tokens, num_kv_heads, head_dim), dtype=dtype)
    return q, k, v, cos, sin, cache, slots


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_cache_write(dtype):
    q, k, v, cos, sin, cache, slots = _rotary_case(dtype)
    expected_q = fused.apply_rotary(q, cos, sin)
    expected_k_cache, expected_v_cache = cache.clone(), cache.clone()
    OPS.cache_write(expected_k_cache, expected_v_cache, fused.apply_rotary(k, cos, sin), v, slots)
    k_cache, v_cache = cache.clone(), cache.clone()
    assert torch.equal(OPS.rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots), expected_q)
    assert torch.equal(k_cache, expected_k_cache) and torch.equal(v_cache, expected_v_cache)
    k_cache, v_cache = (cache.clone().fill_(7).to(DEVICE) for _ in range(2))
    rotated = triton_rotary_cache_write(*(t.to(DEVICE) for t in (q, k, v, cos, sin)), k_cache, v_cache,
                                        slots.to(DEVICE))
    torch.testing.assert_close(rotated.cpu(), expected_q, **TOLERANCE[dtype])
    written = torch.zeros(cache.shape[0] * cache.shape[1], dtype=torch.bool)
    written[slots[slots >= 0]] = True
    flat = lambda c: c.cpu().reshape(-1, *c.shape[2:])  # noqa: E731
    torch.testing.assert_close(flat(k_cache)[written], flat(expected_k_cache)[written], **TOLERANCE[dtype])
    assert torch.equal(flat(v_cache)[written], flat(expected_v_cache)[written])
    assert bool((flat(k_cache)[~written] == 7).all()) and bool((flat(v_cache)[~written] == 7).all())


def test_bad_arguments_are_typed_errors():
    x = torch.zeros(2, 8)
    with pytest.raises(AbiArgumentError, match="weight"):
        OPS.rms_norm(x, torch.zeros(7), 1e-5)
    with pytest.raises(AbiArgumentError, match="delta"):
        OPS.add_rms_norm(x, torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(8), 1e-5)
    with pytest.raises(AbiArgumentError, match="gate_up"):
        OPS.silu_mul(torch.zeros(2, 7))
    with pytest.raises(AbiArgumentError, match="x must be"):
        OPS.rms_norm(torch.zeros(2, 8, dtype=torch.int32), torch.zeros(8), 1e-5)
    q, k, v, cos, sin, cache, slots = _rotary_case(torch.float32)
    with pytest.raises(AbiArgumentError, match="cos"):
        OPS.rotary_cache_write(q, k, v, cos[:, 0], sin, cache, cache.clone(), slots)
    with pytest.raises(AbiArgumentError, match="q must be"):
        OPS.rotary_cache_write(q[:, :, :8], k, v, cos, sin, cache, cache.clone(), slots)


# The compiler, stricter than the interpreter, accepts the fused and greedy sampling kernels (PTX and
# ptxas, sm_90): test_kernels_compile_for_hopper (compile_fused_kernels.py).


def test_ops_have_cuda_kernels_registered():
    for op in ("helios::rms_norm", "helios::add_rms_norm", "helios::silu_mul", "helios::rotary_cache_write",
               "helios::sample", "helios::sampling_weights", "helios::draw_weighted", "helios::verify_proposals"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")

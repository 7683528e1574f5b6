"""The C++ norm, SiLU-mul and rotary kernels (`helios.runtime.loading.fused_cpu_kernels`): against the
bodies they replace (the sums, the rotation and the cache writes bit for bit, the norms within float
rounding), at head sizes on the vectorised and the scalar paths, on views of a fused projection;
other dtypes and layouts, padding slots and slots outside the planes run the bodies (and raise
their errors)."""

from __future__ import annotations

import pytest
import torch

from helios.abi import cpu_bodies
from helios.runtime.loading.fused_cpu_kernels import (
    KernelRotaryPlan, add_rms_norm_body, bind_fused_kernels, build_kernels, plan_rotary_kernel, rms_norm_body,
    rotary_body, silu_mul_body,
)


@pytest.fixture(scope="module")
def kernels():
    return build_kernels()


def _random(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("width", [8, 24, 128, 200])
def test_rms_norm_equals_the_body_within_rounding(kernels, width):
    body = rms_norm_body(kernels.norm)
    for x in (_random(5, width), _random(2, 3, width, seed=1), _random(width, seed=2), _random(4, 2 * width)[:, :width]):
        weight = _random(width, seed=3)
        got, expected = body(x, weight, 1e-6), cpu_bodies.rms_norm(x, weight, 1e-6)
        assert got.shape == expected.shape and got.is_contiguous()
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)


def test_add_rms_norm_gives_the_bodys_sum_bit_for_bit_and_its_norm_within_rounding(kernels):
    body = add_rms_norm_body(kernels.norm)
    fused = _random(6, 3 * 64)
    x, delta, weight = _random(6, 64, seed=1), fused[:, 64:128], _random(64, seed=2)  # delta: a strided view
    (summed, normed), (summed_ref, normed_ref) = body(x, delta, weight, 1e-5), cpu_bodies.add_rms_norm(x, delta, weight, 1e-5)
    assert torch.equal(summed, summed_ref)
    torch.testing.assert_close(normed, normed_ref, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("width", [8, 96, 384, 100])
def test_silu_mul_equals_the_body_within_rounding(kernels, width):
    body = silu_mul_body(kernels.silu_mul)
    for gate_up in (_random(7, 2 * width) * 4, _random(7, 3 * width)[:, :2 * width]):
        got, expected = body(gate_up), cpu_bodies.silu_mul(gate_up)
        assert got.shape == expected.shape == (7, width)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_other_dtypes_and_layouts_run_the_bodies(kernels):
    x, weight = _random(4, 32).to(torch.bfloat16), _random(32, seed=1)
    assert torch.equal(rms_norm_body(kernels.norm)(x, weight, 1e-6), cpu_bodies.rms_norm(x, weight, 1e-6))
    strided = _random(4, 3, 64)[:, :, :32]  # not rows of one stride
    assert torch.equal(rms_norm_body(kernels.norm)(strided, weight, 1e-6), cpu_bodies.rms_norm(strided, weight, 1e-6))
    transposed = _random(32, 4).t()
    assert torch.equal(rms_norm_body(kernels.norm)(transposed, weight, 1e-6),
                       cpu_bodies.rms_norm(transposed, weight, 1e-6))
    half = weight.to(torch.bfloat16)  # a weight of another dtype
    plain = _random(4, 32)
    assert torch.equal(rms_norm_body(kernels.norm)(plain, half, 1e-6), cpu_bodies.rms_norm(plain, half, 1e-6))
    gate_up = _random(3, 16).to(torch.bfloat16)
    assert torch.equal(silu_mul_body(kernels.silu_mul)(gate_up), cpu_bodies.silu_mul(gate_up))
    odd = _random(3, 9)  # an odd width: not two halves
    with pytest.raises(Exception) as kernel_error:
        silu_mul_body(kernels.silu_mul)(odd)
    with pytest.raises(type(kernel_error.value)):
        cpu_bodies.silu_mul(odd)


PAGES, PAGE_TOKENS = 5, 4


def _rotary_case(dim: int, tokens: int, slots, q_heads: int = 4, kv_heads: int = 2, seed: int = 0):
    """q, k, v as views of one fused projection, layered planes (one layer's planes passed), the plan."""
    fused = _random(tokens, (q_heads + 2 * kv_heads) * dim, seed=seed)
    q, k, v = (t.reshape(tokens, -1, dim) for t in fused.split([q_heads * dim, kv_heads * dim, kv_heads * dim], -1))
    angles = torch.arange(tokens, dtype=torch.float32)[:, None] * _random(dim // 2, seed=seed + 1)[None]
    angles = torch.cat([angles, angles], -1)
    plan = plan_rotary_kernel(angles.cos().unsqueeze(1), angles.sin().unsqueeze(1),
                              cpu_bodies.plan_slots(torch.tensor(slots)))
    planes = _random(2, 3, PAGES, PAGE_TOKENS, kv_heads, dim, seed=seed + 2)
    return q, k, v, planes, plan


def _rotate_both(body, q, k, v, planes, plan):
    expected_planes = planes.clone()
    expected = cpu_bodies.rotary_cache_write_planned(q, k, v, expected_planes[0, 1], expected_planes[1, 1], plan)
    got = body(q, k, v, planes[0, 1], planes[1, 1], plan)
    return got, expected, planes, expected_planes


@pytest.mark.parametrize("dim", [8, 32, 64, 128, 12])
def test_rotary_rotates_and_writes_what_the_body_does_bit_for_bit(kernels, dim):
    q, k, v, planes, plan = _rotary_case(dim, 5, [0, 17, 6, 3, 12])
    got, expected, planes, expected_planes = _rotate_both(rotary_body(kernels.rotary), q, k, v, planes, plan)
    assert got.is_contiguous() and torch.equal(got, expected)
    assert torch.equal(planes, expected_planes)
    assert torch.equal(planes[1, 1].reshape(-1, 2, dim)[17], v[1])
    reference = cpu_bodies.plan_rotary(plan.cos, plan.sin, plan.slots)  # the body's own plan: the body's bits
    assert isinstance(plan, KernelRotaryPlan) and torch.equal(plan.signed_sin, reference.signed_sin)
    again = planes.clone()
    assert torch.equal(rotary_body(kernels.rotary)(q, k, v, again[0, 1], again[1, 1], reference), got)


def test_rotary_with_padding_slots_other_dtypes_or_slots_outside_the_planes_runs_the_body(kernels):
    body = rotary_body(kernels.rotary)
    q, k, v, planes, plan = _rotary_case(32, 4, [3, -1, 9, 2])
    assert plan.slots.keep is not None
    got, expected, planes, expected_planes = _rotate_both(body, q, k, v, planes, plan)
    assert torch.equal(got, expected) and torch.equal(planes, expected_planes)
    q, k, v, planes, plan = _rotary_case(32, 3, [1, 2, PAGES * PAGE_TOKENS])  # past the planes
    before = planes.clone()
    with pytest.raises(IndexError) as kernel_error:  # index_copy_'s error, as the body raises it
        body(q, k, v, planes[0, 1], planes[1, 1], plan)
    with pytest.raises(type(kernel_error.value)):
        cpu_bodies.rotary_cache_write_planned(q, k, v, before[0, 1], before[1, 1], plan)
    q, k, v, planes, plan = _rotary_case(32, 3, [1, 2, 3])
    q, k, v, half = (t.to(torch.bfloat16) for t in (q, k, v, planes))  # another dtype throughout
    plan = plan_rotary_kernel(plan.cos.to(torch.bfloat16), plan.sin.to(torch.bfloat16), plan.slots)
    got, expected, half, expected_half = _rotate_both(body, q, k, v, half, plan)
    assert torch.equal(got, expected) and torch.equal(half, expected_half)


def test_a_call_site_checks_again_when_its_layouts_change(kernels):
    body = rms_norm_body(kernels.norm)
    weight = _random(16, seed=1)
    for x in (_random(3, 16), _random(3, 16).to(torch.bfloat16), _random(5, 16), _random(3, 32)[:, ::2]):
        got, expected = body(x, weight, 1e-6), cpu_bodies.rms_norm(x, weight, 1e-6)
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)


def test_binding_points_the_bodies_calls_at_the_kernels(kernels):
    graph = torch.fx.Graph()
    x, w, gate_up = graph.placeholder("x"), graph.placeholder("w"), graph.placeholder("gate_up")
    normed = graph.call_function(cpu_bodies.rms_norm, (x, w, 1e-6))
    both = graph.call_function(cpu_bodies.add_rms_norm, (x, normed, w, 1e-6))
    other = graph.call_function(torch.add, (x, 1))
    cos, sin, slots, q = (graph.placeholder(name) for name in ("cos", "sin", "slots", "q"))
    plan = graph.call_function(cpu_bodies.plan_rotary, (cos, sin, slots))
    rotated = graph.call_function(cpu_bodies.rotary_cache_write_planned, (q, q, q, x, x, plan))
    graph.output((graph.call_function(cpu_bodies.silu_mul, (gate_up,)), both, other, rotated))
    assert bind_fused_kernels(graph, kernels) == 4
    names = [getattr(n.target, "__name__", "") for n in graph.nodes if n.op == "call_function"]
    assert names == ["rms_norm_kernel", "add_rms_norm_kernel", "add", "plan_rotary_kernel",
                     "rotary_cache_write_kernel", "silu_mul_kernel"]

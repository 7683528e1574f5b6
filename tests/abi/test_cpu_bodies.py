"""`helios.abi.cpu_bodies` and the two-stage paged reference: every fast CPU body gives the
registered body's values bit for bit (the rotation as a roll over q and k joined, step plans shared
by layers, sampling of selected rows), on float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from abi.test_attention import make_layout
from abi.test_sampling_cpu import _awkward_logits, _inputs
from helios.abi import cpu_bodies, fused, sampling
from helios.abi.attention import _reference_attention
from helios.abi.paged_reference import plan_attention


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_and_silu_mul_are_the_registered_bodies_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(0)
    x, delta = (torch.randn(5, 24, generator=generator).to(dtype) for _ in range(2))
    for weight in (torch.rand(24, generator=generator).to(dtype) + 0.5, torch.rand(24, generator=generator) + 0.5):
        assert _same(cpu_bodies.rms_norm(x, weight, 1e-6), fused.rms_norm(x, weight, 1e-6))
        for got, expected in zip(cpu_bodies.add_rms_norm(x, delta, weight, 1e-5),
                                 fused.add_rms_norm(x, delta, weight, 1e-5)):
            assert _same(got, expected)
    gate_up = torch.randn(5, 16, generator=generator).to(dtype)
    assert _same(cpu_bodies.silu_mul(gate_up), fused.silu_mul(gate_up))
    assert _same(cpu_bodies.gelu_tanh_mul(gate_up), fused.gelu_tanh_mul(gate_up))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_mul_is_transformers_gated_gelu_tanh(dtype):
    """``helios::gelu_tanh_mul`` is Gemma's MLP activation: transformers' ``gelu_pytorch_tanh`` of the
    gate columns times the up columns, bit for bit (the registered op and the unchecked CPU body)."""
    from transformers.activations import ACT2FN

    gate_up = (3 * torch.randn(6, 20, generator=torch.Generator().manual_seed(1))).to(dtype)
    expected = ACT2FN["gelu_pytorch_tanh"](gate_up[:, :10]) * gate_up[:, 10:]
    assert _same(torch.ops.helios.gelu_tanh_mul(gate_up), expected)
    assert _same(cpu_bodies.gelu_tanh_mul(gate_up), expected)
    assert not torch.equal(expected, torch.ops.helios.silu_mul(gate_up))
    with pytest.raises(ValueError, match="helios::gelu_tanh_mul: gate_up must be"):
        torch.ops.helios.gelu_tanh_mul(gate_up[:, :9])


def _rotary_inputs(dtype, rows: int, fused_qkv: bool, slots: list[int]):
    generator = torch.Generator().manual_seed(len(slots))
    heads, kv_heads, dim = 4, 2, 8
    if fused_qkv:  # the split of one projection: k's heads follow q's in every row
        qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
        sizes = [heads, kv_heads, kv_heads]
        q, k, v = (part.reshape(rows, n, dim) for part, n in zip(qkv.split([n * dim for n in sizes], -1), sizes))
    else:
        q = torch.randn(rows, heads, dim, generator=generator).to(dtype)
        k, v = (torch.randn(rows, kv_heads, dim, generator=generator).to(dtype) for _ in range(2))
    angles = torch.randn(rows, 1, dim // 2, generator=generator)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    caches = [torch.zeros(6, 4, kv_heads, dim, dtype=dtype) for _ in range(2)]
    return q, k, v, cos, sin, caches, torch.tensor(slots, dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused_qkv", [True, False])
@pytest.mark.parametrize("slots", [[3, 9, 20], [3, -1, 20], []])
def test_planned_rotary_cache_writes_are_the_registered_body_bit_for_bit(dtype, fused_qkv, slots):
    q, k, v, cos, sin, (k_cache, v_cache), slot_mapping = _rotary_inputs(dtype, len(slots), fused_qkv, slots)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected = fused.rotary_cache_write(q, k, v, cos, sin, expected_k, expected_v, slot_mapping)
    assert (cpu_bodies._adjacent_heads(q, k) is not None) == (fused_qkv and bool(slots))
    plan = cpu_bodies.plan_rotary(cos, sin, cpu_bodies.plan_slots(slot_mapping))
    got = cpu_bodies.rotary_cache_write_planned(q, k, v, k_cache, v_cache, plan)
    assert _same(got, expected) and got.is_contiguous()
    assert _same(k_cache, expected_k) and _same(v_cache, expected_v)


@pytest.mark.parametrize("query_lens, cached_lens, window", [
    ([1, 1, 1], [5, 17, 0], 0),  # a full decode step
    ([1, 1, 1], [30, 2, 12], 5),  # with a window
    ([6, 1, 0, 3], [0, 9, 4, 2], 0),  # prompt rows, a decoding lane, an inactive row
    ([1, 4, 1], [3, 0, 7], 3),  # decoding lanes around a prompt row
])
def test_one_plan_serves_every_layer_with_the_references_values(query_lens, cached_lens, window):
    layers = [make_layout(seed, query_lens, cached_lens, 2, 2, 4, padding=1) for seed in (1, 2)]
    first = layers[0]
    plan = plan_attention(first.page_table, first.query_start, first.positions, window, first.k_cache)
    for seed, layer in zip((1, 2), layers):
        q = make_layout(seed + 10, query_lens, cached_lens, 2, 2, 4, padding=1).q
        expected = _reference_attention(q, layer.k_cache, layer.v_cache, first.page_table, first.query_start,
                                        first.positions, 0.3, window)
        assert _same(cpu_bodies.attention_planned(q, layer.k_cache, layer.v_cache, plan, 0.3), expected)


def test_a_plan_refuses_planes_of_another_geometry():
    layout = make_layout(0, [1, 1], [3, 5], 2, 1, 4, padding=0)
    plan = plan_attention(layout.page_table, layout.query_start, layout.positions, 0, layout.k_cache)
    with pytest.raises(ValueError, match="planned for planes"):
        cpu_bodies.attention_planned(layout.q, layout.k_cache[:, :2], layout.v_cache[:, :2], plan, 0.5)


def _args(inputs: dict) -> list:
    return [inputs[name] for name in ("logits", "seeds", "counters", "temperature", "top_k", "top_p", "min_p",
                                      "penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows")]


@pytest.mark.parametrize("case", ["greedy", "penalised", "drawing", "padding"])
def test_sampling_selected_rows_gives_the_ops_tokens_there_and_no_token_elsewhere(case):
    inputs = _inputs(_awkward_logits(8, 70, seed=3), seed=3)
    rows = torch.tensor([True, False, True, True, True, False, True, True])
    if case == "penalised":
        inputs["penalties"][2] = torch.tensor([1.3, 0.2, 0.1])
    elif case == "drawing":
        inputs["temperature"][3], inputs["top_k"][3] = 0.8, 5
    elif case == "padding":  # unselected rows hold zeros: a repetition penalty of 0
        inputs["penalties"][~rows] = 0.0
        inputs["temperature"][~rows] = 0.0
    expected = sampling.sample(*_args(inputs))
    got = cpu_bodies.sample_rows(*_args(inputs), rows)
    assert torch.equal(got[rows], expected[rows]) and (got[~rows] == sampling.NO_TOKEN).all()
    assert torch.equal(cpu_bodies.sample_rows(*_args(inputs), torch.ones(8, dtype=torch.bool)), expected)
    assert (cpu_bodies.sample_rows(*_args(inputs), torch.zeros(8, dtype=torch.bool)) == sampling.NO_TOKEN).all()


def test_padding_rows_no_longer_send_a_greedy_call_down_the_reference(monkeypatch):
    inputs = _inputs(_awkward_logits(6, 64, seed=1), seed=1)
    rows = torch.tensor([True, True, True, False, False, False])
    inputs["penalties"][~rows] = 0.0
    monkeypatch.setattr(sampling, "sample_reference", lambda *a, **k: pytest.fail("took the reference pipeline"))
    cpu_bodies.sample_rows(*_args(inputs), rows)

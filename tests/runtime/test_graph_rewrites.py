"""Exact load-time graph rewrites (`helios.runtime.loading.graph_rewrites`)."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.loading.graph_rewrites import fuse_rotary_halves


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(torch.nn.Module):
    """Queries and keys of two layers rotated as transformers does, sharing cos and sin."""

    def forward(self, q, k, positions, inv_freq):
        angles = positions[:, None].float() * inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        outs = []
        for layer in range(2):
            q_l, k_l = q * (layer + 1), k - layer
            outs.append(q_l * cos + rotate_half(q_l) * sin)
            outs.append(k_l * cos + sin * rotate_half(k_l))  # the factor on either side
        return tuple(outs)


def _inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    q = (torch.randn(5, 4, 32, generator=generator) * 3).to(dtype)
    k = (torch.randn(5, 2, 32, generator=generator) * 3).to(dtype)
    return q, k, torch.tensor([0, 3, 7, 100, 4095]), 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))


def _count(module, target) -> int:
    return sum(1 for n in module.graph.nodes if n.op == "call_function" and n.target is target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotations_become_rolls_with_the_same_values_bit_for_bit(dtype):
    inputs = _inputs(dtype)
    module = torch.export.export(Rotary(), inputs, strict=False).module()
    expected = module(*inputs)
    negations = _count(module, torch.ops.aten.neg.default)
    assert fuse_rotary_halves(module.graph) == 4
    module.graph.lint()
    module.recompile()
    got = module(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert _count(module, torch.ops.aten.roll.default) == 4
    assert _count(module, torch.ops.aten.neg.default) == negations - 4 + 1  # one signed sin for all four
    assert fuse_rotary_halves(module.graph) == 0  # nothing left to rewrite


class Unmatched(torch.nn.Module):
    """A rotation multiplied by a broadcast factor, and one whose halves are also used elsewhere."""

    def forward(self, x, scale):
        first = rotate_half(x) * scale  # scale [.., 1]: not a sin of the full extent
        rotated = rotate_half(x + 1)
        return first, rotated * scale.expand_as(x), rotated + 1


def test_rotations_with_other_uses_or_a_broadcast_factor_are_left_alone():
    inputs = (torch.randn(3, 2, 8), torch.randn(3, 2, 1))
    module = torch.export.export(Unmatched(), inputs, strict=False).module()
    before = [n.target for n in module.graph.nodes]
    assert fuse_rotary_halves(module.graph) == 0
    assert [n.target for n in module.graph.nodes] == before

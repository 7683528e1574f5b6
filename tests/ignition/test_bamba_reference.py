"""The Bamba reference's gated norm is Mamba2's grouped norm on every transformers release
(support.bamba_reference): an ungrouped norm (transformers 5.17, the GPU machine's) is regrouped
and then equals the recipe's `gated_group_norm`, which it did not before."""

from __future__ import annotations

import torch

from helios.ignition.hybrid_decoder import gated_group_norm
from support.bamba_reference import grouped_gated_norm


class _UngroupedNorm(torch.nn.Module):
    """transformers 5.17's BambaRMSNormGated: one RMS over the whole width."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))
        self.variance_epsilon = 1e-5

    def forward(self, hidden_states, gate=None):
        x = hidden_states.float() * torch.nn.functional.silu(gate.float())
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


_UngroupedNorm.__name__ = "BambaRMSNormGated"


class _Mixer(torch.nn.Module):
    def __init__(self, width: int, groups: int):
        super().__init__()
        self.n_groups = groups
        self.norm = _UngroupedNorm(width)


def test_an_ungrouped_norm_becomes_mamba2s_grouped_norm():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Mixer(16, 2), _Mixer(16, 1))
    x, gate = torch.randn(3, 16), torch.randn(3, 16)
    recipe = gated_group_norm(x, gate, model[0].norm.weight.detach(), 2, 1e-5)
    assert not torch.allclose(model[0].norm(x, gate), recipe, atol=1e-4)
    assert grouped_gated_norm(model) == 1  # a one-group norm is the same either way
    torch.testing.assert_close(model[0].norm(x, gate), recipe, rtol=1e-5, atol=1e-5)
    grouped_gated_norm(model)  # again: the same grouped norm
    torch.testing.assert_close(model[0].norm(x, gate), recipe, rtol=1e-5, atol=1e-5)

"""The transformers Bamba reference with Mamba2's grouped gated norm, whatever the installed version.

Mamba2 (`mamba_ssm`'s ``Mamba2``: ``RMSNormGated(..., group_size=d_ssm // ngroups)``) normalises
the gated scan output per group of ``intermediate / n_groups`` channels, and so does Helios's
recipe (`helios.ignition.hybrid_decoder.gated_group_norm`). `transformers` releases before the fix
(5.17, the GPU machine's) normalise ``BambaRMSNormGated`` over the whole intermediate width, which
differs whenever ``mamba_n_groups`` > 1 (the tiny test config has 2): every hidden state after the
first mixer layer changes, so greedy tokens disagree even on a full recompute without a cache.
Later releases (5.24) take ``group_size`` and agree with Mamba2. `grouped_gated_norm` gives an
older model the grouped norm, so a test's reference is the same on every installed version.
"""

from __future__ import annotations

import types

import torch


def _grouped_forward(norm: torch.nn.Module, groups: int):
    def forward(self, hidden_states, gate=None):
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        if gate is not None:
            x = x * torch.nn.functional.silu(gate.to(torch.float32))
        grouped = x.view(*x.shape[:-1], groups, x.shape[-1] // groups)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * grouped.view(x.shape).to(dtype)

    return types.MethodType(forward, norm)


def grouped_gated_norm(model: torch.nn.Module) -> int:
    """Gives every Bamba mixer norm of `model` that normalises over the whole width (no
    ``group_size``) the grouped norm of Mamba2; returns how many norms were changed (0 on a
    transformers release that already groups)."""
    changed = 0
    for module in model.modules():
        norm = getattr(module, "norm", None)
        groups = getattr(module, "n_groups", None)
        if norm is None or groups is None or not type(norm).__name__.endswith("RMSNormGated"):
            continue
        if hasattr(norm, "group_size") or groups == 1:
            continue
        norm.forward = _grouped_forward(norm, groups)
        changed += 1
    return changed

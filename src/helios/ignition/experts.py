"""Mixture-of-experts MLP inside the generic decoder (layers an Architecture's ``experts`` covers).

Routing (``helios::moe_route``) scores the float32 router logits of each token as the family's
`RoutedExperts` says; the chosen experts run through ``helios::moe_experts`` (a grouped SwiGLU that
reads only the selected experts' weights), and shared experts, when present, run as one gated MLP
on every token and are added. With tensor parallelism every rank holds the same router and a slice
of every expert's (and the shared experts') intermediate width, so routing is identical on every
rank and the partial outputs of routed and shared experts are summed with one ``helios::all_reduce``.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

import helios.abi.collectives  # noqa: F401  (registers helios::all_reduce)
import helios.abi.moe  # noqa: F401  (registers helios::moe_route and helios::moe_experts)
from helios.ignition.architecture import Architecture


def experts_block(arch: Architecture, w: Mapping[str, torch.Tensor], prefix: str, hidden: torch.Tensor):
    """[T, H] output of the layer's experts for the normed hidden states [T, H]."""
    experts = arch.experts
    logits = F.linear(hidden.to(torch.float32), w[prefix + "router.weight"])
    weights, ids = torch.ops.helios.moe_route(
        logits, w.get(prefix + "router.bias"), experts.scoring, experts.top_k, experts.num_groups,
        experts.topk_groups, experts.normalize, experts.scale)
    out = torch.ops.helios.moe_experts(hidden, weights, ids, w[prefix + "experts.gate_up"], None,
                                       w[prefix + "experts.down"], None, "silu", 0.0, 0.0)
    if experts.shared_intermediate_size:
        gate, up = F.linear(hidden, w[prefix + "shared.gate_up.weight"]).chunk(2, dim=-1)
        out = out + F.linear(F.silu(gate) * up, w[prefix + "shared.down.weight"])
    if arch.tensor_parallel > 1:
        out = torch.ops.helios.all_reduce(out, arch.tensor_parallel)
    return out

"""Execution ABI: SparseMixer top-2 routing (namespace ``helios``), PhiMoE's router at inference.

``helios::moe_route_sparsemixer(Tensor logits, float jitter_eps) -> (Tensor, Tensor)``
    logits: [T, E] router logits (any float dtype; routed in that dtype, as the reference does), E >= 2.
    Returns ``(weights, ids)``: weights float32 [T, 2], ids int64 [T, 2]. Two rounds, for each token:
      1. e1 = argmax(s) (m1 = s[e1]); the experts j with (m1 - s_j) / max(|s_j|, m1) > 2 jitter_eps
         are masked out, and w1 = softmax(s over the rest)[e1];
      2. with e1 masked out, e2 = argmax of the others (m2 = its logit); the experts j with
         (m2 - s_j) / max(|s_j|, m2) > 2 jitter_eps and e1 are masked out, w2 = softmax(rest)[e2].
    (transformers' ``sparsemixer`` with ``training`` False: no Gumbel sampling, no gradient estimate.)
    jitter_eps: a finite number >= 0, else an `AbiArgumentError`.

A separate op rather than a scoring of ``helios::moe_route``: its jitter threshold is an argument
that op's schema does not have, and a schema never changes once a core uses it. The body is plain
tensor ops (no host reads, static shapes), so it also serves CUDA, where it is captured in graphs;
its weights and ids feed ``helios::moe_experts`` as any routing's do.
"""

from __future__ import annotations

import math

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError

__all__ = ["MOE_ROUTE_SPARSEMIXER_SCHEMA", "moe_route_sparsemixer", "reference_sparsemixer"]

MOE_ROUTE_SPARSEMIXER_SCHEMA = "(Tensor logits, float jitter_eps) -> (Tensor, Tensor)"
_SPARSEMIXER = "helios::moe_route_sparsemixer"
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def check_sparsemixer_args(logits, jitter_eps) -> None:
    """Metadata-only validation (safe on fake tensors)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in _FLOATS \
            or logits.shape[1] < 2:
        raise AbiArgumentError(f"{_SPARSEMIXER}: logits must be a float tensor [T, E] with E >= 2")
    if isinstance(jitter_eps, bool) or not isinstance(jitter_eps, (int, float)) or not math.isfinite(jitter_eps) \
            or jitter_eps < 0:
        raise AbiArgumentError(f"{_SPARSEMIXER}: jitter_eps must be a finite number >= 0, got {jitter_eps!r}")


def _round(scores: torch.Tensor, candidates: torch.Tensor, jitter_eps: float):
    """(weight [T, 1], id [T, 1]) of one round over `candidates` (scores with earlier picks at -inf),
    its threshold measured against the unmasked `scores`, as the reference measures it."""
    top, chosen = candidates.max(dim=-1, keepdim=True)
    factor = scores.abs().clamp(min=top)
    masked = candidates.masked_fill((top - scores) / factor > 2 * jitter_eps, float("-inf"))
    return torch.softmax(masked, dim=-1).gather(-1, chosen), chosen


def reference_sparsemixer(logits: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing arithmetic (device tensor ops only)."""
    first, first_id = _round(logits, logits, jitter_eps)
    second, second_id = _round(logits, logits.scatter(-1, first_id, float("-inf")), jitter_eps)
    weights = torch.cat((first, second), dim=-1).to(torch.float32)
    return weights, torch.cat((first_id, second_id), dim=-1)


@abi_op(_SPARSEMIXER, mutates_args=(), schema=MOE_ROUTE_SPARSEMIXER_SCHEMA)
def moe_route_sparsemixer(logits: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    check_sparsemixer_args(logits, jitter_eps)
    return reference_sparsemixer(logits, jitter_eps)


@moe_route_sparsemixer.register_fake
def _sparsemixer_fake(logits, jitter_eps):
    check_sparsemixer_args(logits, jitter_eps)
    rows = logits.shape[0]
    return logits.new_empty((rows, 2), dtype=torch.float32), logits.new_empty((rows, 2), dtype=torch.int64)

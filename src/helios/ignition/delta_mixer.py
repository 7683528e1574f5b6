"""The Gated DeltaNet layer of a hybrid decoder (Qwen3-Next's linear attention) over one packed step.

Weight slots and geometry: `helios.ignition.recurrent_geometry` (``layers.i.delta.*``). Per token:
one projection gives q, k, v (the convolved channels), the output gate z and b, a; q/k/v go
through the causal short convolution (``helios::causal_conv_update``, zero bias) and SiLU; the
recurrence is ``helios::gated_delta_rule`` with beta = sigmoid(b) and the log decay
g = A softplus(a + dt_bias) (float32); each value head's output is RMS-normed, weighted, gated by
silu(z) (`gated_head_norm`) and projected by ``out`` (under tensor parallelism each rank's key heads
and their value heads; the ranks' outputs summed by one all-reduce). OLMo Hybrid's geometry scales beta
(``beta_scale``) and norms with its own epsilon (``norm_eps``). Both ops advance the row's state rows in
place (``conv_state`` and ``ssm_state`` of `helios.ignition.hybrid_decoder.HybridStorage`). The
arithmetic mirrors transformers' Qwen3NextGatedDeltaNet (float32 decay, rule and norm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import helios.abi.delta_rule  # noqa: F401  (registers helios::gated_delta_rule)
import helios.abi.recurrent  # noqa: F401  (registers helios::causal_conv_update)
from helios.ignition.architecture import Architecture
from helios.ignition.recurrent_geometry import GatedDeltaNetGeometry
from helios.ignition.tensor_parallel import row_parallel_linear


def delta_block(arch: Architecture, w, prefix: str, hidden: torch.Tensor, planes, step, state) -> torch.Tensor:
    """The Gated DeltaNet layer's output [T, H]; advances the rows' convolution and rule state in place.
    `planes` = (this layer's conv_state, its ssm_state); `step` a PackedStep, `state` a RowState."""
    g: GatedDeltaNetGeometry = arch.recurrent
    p, num_tokens = prefix + "delta.", hidden.shape[0]
    conv_plane, rule_plane = planes
    projected = F.linear(hidden, w[p + "in_proj.weight"])
    qkv, z, b, a = projected.split([g.conv_dim, g.value_dim, g.num_value_heads, g.num_value_heads], dim=-1)
    qkv = F.silu(torch.ops.helios.causal_conv_update(
        conv_plane, qkv.contiguous(), w[p + "conv.weight"], w[p + "conv.bias"], step.query_start, state.rows,
        state.fresh, state.max_query_len))
    q, k, v = qkv.split([g.key_dim, g.key_dim, g.value_dim], dim=-1)
    decay = w[p + "A"] * F.softplus(a.to(torch.float32) + w[p + "dt_bias"])
    attended = torch.ops.helios.gated_delta_rule(
        rule_plane, q.reshape(num_tokens, g.num_key_heads, g.key_head_dim).contiguous(),
        k.reshape(num_tokens, g.num_key_heads, g.key_head_dim).contiguous(),
        v.reshape(num_tokens, g.num_value_heads, g.value_head_dim).contiguous(), decay.contiguous(),
        _beta(b, g.beta_scale), step.query_start, state.rows, state.fresh, state.max_query_len)
    gate = z.reshape(num_tokens, g.num_value_heads, g.value_head_dim)
    eps = arch.rms_norm_eps if g.norm_eps is None else g.norm_eps
    normed = gated_head_norm(attended, gate, w[p + "norm"], eps)
    return row_parallel_linear(arch, normed.reshape(num_tokens, g.value_dim), w[p + "out.weight"], None)


def _beta(b: torch.Tensor, scale: float) -> torch.Tensor:
    """The write strength sigmoid(b), times `scale` where it is not 1 (OLMo Hybrid's allow_neg_eigval: 2)."""
    beta = torch.sigmoid(b)
    return (beta if scale == 1.0 else beta * scale).contiguous()


def gated_head_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of x over its last dim in float32, times `weight` in x's dtype, then times silu(gate)
    in float32 (transformers' Qwen3NextRMSNormGated: norm before gate, unlike Mamba2's)."""
    x32 = x.to(torch.float32)
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return ((weight * normed) * F.silu(gate.to(torch.float32))).to(x.dtype)

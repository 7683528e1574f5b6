"""The Kimi Delta Attention layer of a hybrid decoder (Kimi Linear's linear attention) over one packed step.

Weight slots and geometry: `helios.ignition.recurrent_geometry.KimiDeltaGeometry` (``layers.i.kda.*``). Per
token: one projection gives q, k, v (the convolved channels) and b; q/k/v go through the causal short
convolution (``helios::causal_conv_update``, zero bias) and SiLU; the forget gate's log decay, one per key
channel, is g = A softplus(f_b f_a x + dt_bias) (float32; Bailing's: full-rank f, and under its safe gate
lower_bound sigmoid(-A (f x + dt_bias))); the recurrence is ``helios::gated_delta_rule``
with that per-channel g and beta = sigmoid(b); each head's output is RMS-normed in float32, weighted
(float32), gated by sigmoid(g_b g_a x) and projected by ``out``. Both ops advance the row's state rows in
place. The arithmetic mirrors transformers' KimiLinearDeltaAttention (recurrent_kimi_delta_attention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import helios.abi.delta_rule  # noqa: F401  (registers helios::gated_delta_rule)
import helios.abi.recurrent  # noqa: F401  (registers helios::causal_conv_update)
from helios.ignition.architecture import Architecture
from helios.ignition.recurrent_geometry import KimiDeltaGeometry
from helios.ignition.tensor_parallel import row_parallel_linear


def kimi_block(arch: Architecture, w, prefix: str, hidden: torch.Tensor, planes, step, state) -> torch.Tensor:
    """The Kimi Delta Attention layer's output [T, H]; advances the rows' convolution and rule state in place."""
    g: KimiDeltaGeometry = arch.recurrent
    p, num_tokens = prefix + "kda.", hidden.shape[0]
    heads = (num_tokens, g.num_heads, g.head_dim)
    conv_plane, rule_plane = planes
    qkv, b = F.linear(hidden, w[p + "in_proj.weight"]).split([g.conv_dim, g.num_heads], dim=-1)
    qkv = F.silu(torch.ops.helios.causal_conv_update(
        conv_plane, qkv.contiguous(), w[p + "conv.weight"], w[p + "conv.bias"], step.query_start, state.rows,
        state.fresh, state.max_query_len))
    q, k, v = qkv.split([g.qkv_dim] * 3, dim=-1)
    gated = (_gate(g, w, p + "f", hidden).to(torch.float32) + w[p + "dt_bias"]).view(heads)
    if g.lower_bound < 0:  # Bailing's safe gate: within (lower_bound, 0)
        decay = g.lower_bound * torch.sigmoid(-w[p + "A"][:, None] * gated)
    else:
        decay = w[p + "A"][:, None] * F.softplus(gated)
    attended = torch.ops.helios.gated_delta_rule(
        rule_plane, q.reshape(heads).contiguous(), k.reshape(heads).contiguous(), v.reshape(heads).contiguous(),
        decay.contiguous(), torch.sigmoid(b).contiguous(), step.query_start, state.rows, state.fresh,
        state.max_query_len)
    gate = _gate(g, w, p + "g", hidden).view(heads)
    x32 = attended.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + arch.rms_norm_eps)
    normed = (w[p + "norm"].to(torch.float32) * normed * torch.sigmoid(gate.to(torch.float32))).to(hidden.dtype)
    return row_parallel_linear(arch, normed.reshape(num_tokens, g.qkv_dim), w[p + "out.weight"], None)


def _gate(g: KimiDeltaGeometry, w, name: str, hidden: torch.Tensor) -> torch.Tensor:
    """A gate projection [T, qkv_dim]: low-rank (``name_a`` then ``name_b``) or full-rank (``name``)."""
    if g.low_rank_gates:
        return F.linear(F.linear(hidden, w[name + "_a.weight"]), w[name + "_b.weight"])
    return F.linear(hidden, w[name + ".weight"])

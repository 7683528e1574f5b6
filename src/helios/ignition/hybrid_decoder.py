"""The hybrid decoder forward: attention layers and recurrent mixer layers over one packed step.

Same packed geometry and weights convention as `helios.ignition.decoder`; the layers listed in
`Architecture.recurrent` run a Mamba2-style mixer instead of attention (in_proj, causal depthwise
convolution, selective state-space scan, gated group RMS norm, out_proj), whose state advances in
the slot's state rows through the ABI ops of `helios.abi.recurrent` - or, where the geometry is a
`GatedDeltaNetGeometry`, a Gated DeltaNet layer (`helios.ignition.delta_mixer`); where a
`ShortConvGeometry`, a gated short convolution (`helios.ignition.short_conv`); where a
`KimiDeltaGeometry`, Kimi Delta Attention (`helios.ignition.kimi_mixer`). Attention layers
norm each q/k head first where `Architecture.qk_norm`, rotate the leading
`Architecture.rotary_width` head dims (partial rotary), keep their keys/values in the paged planes,
indexed by attention-layer ordinal, and gate their output where `Architecture.attention_gate`; under
`Architecture.post_norm_attention` (OLMo Hybrid) they norm their whole q/k projections and their
block's outputs instead of its inputs. The arithmetic mirrors the Hugging Face
reference (float32 norms and scan), so float32 programs agree with it to rounding.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F

import helios.abi.attention  # noqa: F401  (registers helios::paged_attention(_tuned), helios::cache_write)
import helios.abi.recurrent  # noqa: F401  (registers helios::causal_conv_update, helios::ssm_scan)
from helios.ignition.architecture import Architecture
from helios.ignition.decoder import PackedStep, apply_rotary, mlp_block, projection_norm, rms_norm, rotary_tables
from helios.ignition.delta_mixer import delta_block
from helios.ignition.kimi_mixer import kimi_block
from helios.ignition.recurrent_geometry import GatedDeltaNetGeometry, KimiDeltaGeometry, ShortConvGeometry
from helios.ignition.short_conv import short_conv_block
from helios.ignition.tensor_parallel import embed_tokens, row_parallel_linear


class HybridStorage(NamedTuple):
    """The step's history storage: paged k/v planes of the attention layers, state rows of the mixers."""

    k_cache: torch.Tensor  # [attention layers, pages, page_tokens, Hkv, D]
    v_cache: torch.Tensor
    conv_state: torch.Tensor  # [mixer layers, state rows, conv_dim, conv_kernel - 1]
    ssm_state: torch.Tensor  # float32 [mixer layers, state rows, heads, head_dim, state_size]


class RowState(NamedTuple):
    """Which state row each packed row advances, and whether it starts from zero state."""

    rows: torch.Tensor  # int64 [R], -1 for inactive rows
    fresh: torch.Tensor  # bool [R]
    max_query_len: int  # static bound on a row's tokens (1 for decode programs)


def row_state(step: PackedStep, request_slots: torch.Tensor, max_query_len: int) -> RowState:
    """State row = request slot (one row per request); a row whose first token is position 0 is fresh."""
    num_tokens = step.positions.shape[0]
    first = step.query_start[:-1].to(torch.int64).clamp(max=num_tokens - 1)
    has_tokens = step.query_start[1:] > step.query_start[:-1]
    fresh = has_tokens & (step.positions[first] == 0)
    return RowState(request_slots, fresh, max_query_len)


def hybrid_hidden(arch: Architecture, w: Mapping[str, torch.Tensor], storage: HybridStorage, step: PackedStep,
                  state: RowState, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Final-normed hidden states [T, H]. Mutates the k/v planes and the mixers' state rows in place.
    With `rows` (packed token indices, [N]): the states [N, H] of those tokens alone, the last
    layer's MLP run on them only (after its mixer or attention over every token, which writes every
    state row and cache entry; see `helios.ignition.decoder.decoder_hidden`)."""
    hidden = embed_tokens(arch, w["embed"], w.get("vocab.start"), step.token_ids)
    cos, sin = rotary_tables(step.positions, w["rope.inv_freq"], hidden.dtype)
    mixers = {layer: index for index, layer in enumerate(arch.recurrent.layers)}
    mixer = {GatedDeltaNetGeometry: delta_block, ShortConvGeometry: short_conv_block,
             KimiDeltaGeometry: kimi_block}.get(type(arch.recurrent), mixer_block)
    attention = {layer: index for index, layer in enumerate(arch.attention_layers)}
    for layer in range(arch.num_layers):
        prefix = f"layers.{layer}."
        if arch.post_norm_attention and layer in attention:  # OLMo Hybrid: outputs normed, no pre-norms
            planes = (storage.k_cache[attention[layer]], storage.v_cache[attention[layer]])
            out = attention_block(arch, w, prefix, hidden, planes, step, (cos, sin))
            hidden = hidden + rms_norm(out, w[prefix + "attn_out_norm"], arch.rms_norm_eps)
            if rows is not None and layer == arch.num_layers - 1:
                hidden = hidden[rows]
            out = mlp_block(arch, w, prefix, hidden)
            hidden = hidden + rms_norm(out, w[prefix + "mlp_out_norm"], arch.rms_norm_eps)
            continue
        normed = rms_norm(hidden, w[prefix + "input_norm"], arch.rms_norm_eps)
        delta = 0
        if layer in mixers:
            planes = (storage.conv_state[mixers[layer]], storage.ssm_state[mixers[layer]])
            delta = mixer(arch, w, prefix, normed, planes, step, state)
        if layer in attention:  # beside the mixer under arch.parallel_mixer (Falcon-H1): both outputs added
            planes = (storage.k_cache[attention[layer]], storage.v_cache[attention[layer]])
            delta = delta + attention_block(arch, w, prefix, normed, planes, step, (cos, sin))
        hidden = hidden + delta
        if rows is not None and layer == arch.num_layers - 1:
            hidden = hidden[rows]
        if layer not in arch.mlp_free_layers:
            normed = rms_norm(hidden, w[prefix + "post_norm"], arch.rms_norm_eps)
            hidden = hidden + mlp_block(arch, w, prefix, normed)
    return rms_norm(hidden, w["final_norm"], arch.rms_norm_eps)


def attention_block(arch: Architecture, w, prefix: str, hidden, planes, step: PackedStep, rotary):
    """Self-attention with partial rotary embeddings (and per-head q/k norms, an output gate where the
    Architecture says so), or multi-head latent attention (`helios.ignition.latent`: Kimi Linear);
    writes this step's keys/values (or latents)."""
    num_tokens = hidden.shape[0]
    if arch.latent is not None:
        from helios.ignition.decoder import LayerInputs
        from helios.ignition.latent import latent_attention

        layer = int(prefix.split(".")[1])
        shared = LayerInputs(step, {layer: planes[0]}, {layer: planes[1]}, *rotary)
        attended = latent_attention(arch, w, layer, hidden, shared)
        if arch.latent.head_gate:  # Bailing hybrid: each head's values times sigmoid of its gate row
            gate = torch.sigmoid(F.linear(hidden, w[prefix + "head_gate.weight"]).to(torch.float32)).to(hidden.dtype)
            attended = (attended.view(num_tokens, arch.num_heads, -1) * gate[..., None]).reshape(attended.shape)
        return row_parallel_linear(arch, attended, w[prefix + "o.weight"], None)
    qkv = F.linear(hidden, w[prefix + "qkv.weight"], w.get(prefix + "qkv.bias"))
    gate_size = arch.q_size if arch.attention_gate else 0
    q, k, v, gate = qkv.split([arch.q_size, arch.kv_size, arch.kv_size, gate_size], dim=-1)
    if arch.qk_norm_whole:  # OLMo Hybrid: one norm over each whole projection (summed over the ranks' shares)
        q, k = projection_norm(arch, q, w[prefix + "q_norm"]), projection_norm(arch, k, w[prefix + "k_norm"])
    q = q.reshape(num_tokens, arch.num_heads, arch.head_dim)
    k = k.reshape(num_tokens, arch.num_kv_heads, arch.head_dim)
    if arch.qk_norm and not arch.qk_norm_whole:
        q = rms_norm(q, w[prefix + "q_norm"], arch.rms_norm_eps)
        k = rms_norm(k, w[prefix + "k_norm"], arch.rms_norm_eps)
    q, k = _rotate(q, rotary, arch.rotary_width), _rotate(k, rotary, arch.rotary_width)
    v = v.reshape(num_tokens, arch.num_kv_heads, arch.head_dim)
    k_plane, v_plane = planes
    torch.ops.helios.cache_write(k_plane, v_plane, k, v, step.slot_mapping)
    window = 0
    if step.splits is None:
        attended = torch.ops.helios.paged_attention(
            q, k_plane, v_plane, step.page_table, step.query_start, step.positions, arch.attention_scale, window)
    else:
        attended = torch.ops.helios.paged_attention_tuned(
            q, k_plane, v_plane, step.page_table, step.query_start, step.positions, arch.attention_scale, window,
            step.splits)
    attended = attended.reshape(num_tokens, arch.q_size)
    if arch.attention_gate:
        attended = attended * torch.sigmoid(gate)
    return row_parallel_linear(arch, attended, w[prefix + "o.weight"], w.get(prefix + "o.bias"))


def _rotate(x: torch.Tensor, rotary, width: int) -> torch.Tensor:
    cos, sin = rotary
    if width == x.shape[-1]:
        return apply_rotary(x, cos, sin)
    return torch.cat((apply_rotary(x[..., :width], cos, sin), x[..., width:]), dim=-1)


def mixer_block(arch: Architecture, w, prefix: str, hidden, planes, step: PackedStep, state: RowState):
    """The Mamba2 mixer of one layer; advances the rows' convolution and SSM state in place."""
    g, p = arch.recurrent, prefix + "mixer."
    num_tokens = hidden.shape[0]
    conv_plane, ssm_plane = planes
    projected = F.linear(hidden, w[p + "in_proj.weight"], w.get(p + "in_proj.bias"))
    gate, xbc, dt = projected.split([g.intermediate, g.conv_dim, g.num_heads], dim=-1)
    xbc = F.silu(torch.ops.helios.causal_conv_update(
        conv_plane, xbc.contiguous(), w[p + "conv.weight"], w[p + "conv.bias"], step.query_start, state.rows,
        state.fresh, state.max_query_len))
    x, b, c = xbc.split([g.intermediate, g.num_groups * g.state_size, g.num_groups * g.state_size], dim=-1)
    dt = F.softplus(dt + w[p + "dt_bias"]).clamp(min=g.dt_limit[0], max=g.dt_limit[1])
    heads = x.reshape(num_tokens, g.num_heads, g.head_dim)
    scanned = torch.ops.helios.ssm_scan(
        ssm_plane, heads.contiguous(), dt.contiguous(), w[p + "A"],
        b.reshape(num_tokens, g.num_groups, g.state_size).contiguous(),
        c.reshape(num_tokens, g.num_groups, g.state_size).contiguous(),
        step.query_start, state.rows, state.fresh, state.max_query_len)
    scanned = scanned + heads.to(torch.float32) * w[p + "D"].to(torch.float32)[:, None]
    scanned = scanned.reshape(num_tokens, g.intermediate).to(hidden.dtype)
    if g.gated_norm:
        normed = gated_group_norm(scanned, gate, w[p + "norm"], g.num_groups, arch.rms_norm_eps, g.norm_ranks)
    else:  # gated, not normed (Falcon-H1's mamba_rms_norm false)
        normed = scanned * F.silu(gate)
    return row_parallel_linear(arch, normed, w[p + "out.weight"], w.get(p + "out.bias"))


def gated_group_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int, eps: float,
                     norm_ranks: int = 1):
    """RMS norm over `groups` equal groups of x * silu(gate), in float32 (the reference's gated norm).
    `norm_ranks` > 1: x is this rank's share of one group spread over that many tensor-parallel
    ranks (all of them), whose squares are summed over the ranks."""
    x32 = x.to(torch.float32) * F.silu(gate.to(torch.float32))
    grouped = x32.reshape(*x32.shape[:-1], groups, x32.shape[-1] // groups)
    if norm_ranks == 1:
        mean = grouped.pow(2).mean(-1, keepdim=True)
    else:
        total = torch.ops.helios.all_reduce(grouped.pow(2).sum(-1, keepdim=True).contiguous(), norm_ranks)
        mean = total / (grouped.shape[-1] * norm_ranks)
    grouped = grouped * torch.rsqrt(mean + eps)
    return weight * grouped.reshape(x32.shape).to(x.dtype)

"""Multi-head latent attention inside the generic decoder (an Architecture with ``latent`` set).

A layer's history is its paged latent region: per token the normed latent (C values) and the rotary
key (Dr values), written with ``helios::latent_cache_write`` into the layer's two planes (the
decoder's ``k_cache``/``v_cache`` arguments carry the ``latent_cache``/``rope_cache`` planes). Then
one of two equal computations, picked by the program (`PackedStep.up_project`, a static choice):

* up-projected (PREFILL and SCORED_PREFILL: few rows of many prompt tokens): the latents of every page the
  step's rows reference are gathered and up-projected through ``kv_b`` into per-head keys
  (no-rotary part, then the shared rotary key) and values, and ``helios::paged_attention`` attends
  over them through a page table of the gathered pages. Its cost grows with rows x pages per row,
  which suits a few prompt rows.
* absorbed (DECODE, MIXED, SPECULATIVE, a draft's steps): each head's query is folded into its key
  up-projection (q_latent = q_nope W_UK), ``helios::paged_latent_attention`` reads the latent cache
  directly, and the attended latents go through each head's value up-projection W_UV.

With a token-selecting indexer (``arch.indexer``, `helios.ignition.sparse_latent`) every step attends
absorbed, each query over the positions the indexer selected (``helios::paged_latent_attention_selected``).

The reference order of transformers' DeepseekV3Attention is kept (float32 norms, rotary on halves).
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

import helios.abi.attention  # noqa: F401  (registers helios::paged_attention)
import helios.abi.latent_attention  # noqa: F401  (registers the latent ops)
from helios.ignition.architecture import Architecture
from helios.ignition.decoder import apply_rotary, rms_norm


def latent_attention(arch: Architecture, w: Mapping[str, torch.Tensor], layer: int, hidden, shared) -> torch.Tensor:
    """The attended values [T, Hq Dv] of one latent layer (before ``o``); writes this step's latents
    into the layer's planes."""
    latent_arch, prefix, step = arch.latent, f"layers.{layer}.", shared.step
    q_nope, q_rope, q_latent = _queries(arch, w, prefix, hidden)
    compressed = F.linear(hidden, w[prefix + "kv_a.weight"])
    latent, k_rope = compressed.split([latent_arch.kv_lora_rank, latent_arch.qk_rope_head_dim], dim=-1)
    latent = rms_norm(latent, w[prefix + "kv_a_norm"], latent_arch.norm_eps)
    q_rope = apply_rotary(q_rope, shared.cos, shared.sin)
    k_rope = apply_rotary(k_rope.unsqueeze(1), shared.cos, shared.sin).squeeze(1)
    latent_plane, rope_plane = shared.k_cache[layer], shared.v_cache[layer]
    torch.ops.helios.latent_cache_write(latent_plane, rope_plane, latent.contiguous(), k_rope.contiguous(),
                                        step.slot_mapping)
    kv_b = w[prefix + "kv_b.weight"].view(arch.num_heads, latent_arch.qk_nope_head_dim + latent_arch.v_head_dim,
                                          latent_arch.kv_lora_rank)
    if arch.indexer is not None:
        from helios.ignition.sparse_latent import selected_positions

        selected = selected_positions(arch, w, layer, hidden, q_latent, shared)
        attended = _absorbed(arch, kv_b, q_nope, q_rope, (latent_plane, rope_plane), step, selected)
    elif step.up_project:
        attended = _up_projected(arch, kv_b, q_nope, q_rope, (latent_plane, rope_plane), step)
    else:
        attended = _absorbed(arch, kv_b, q_nope, q_rope, (latent_plane, rope_plane), step)
    return attended.reshape(hidden.shape[0], arch.attention_out_size)


def latent_keys(arch: Architecture, w, layer: int, hidden, shared) -> None:
    """Only the cache write of `latent_attention` (a draft's last layer: no attention needed)."""
    latent_arch, prefix = arch.latent, f"layers.{layer}."
    compressed = F.linear(hidden, w[prefix + "kv_a.weight"])
    latent, k_rope = compressed.split([latent_arch.kv_lora_rank, latent_arch.qk_rope_head_dim], dim=-1)
    latent = rms_norm(latent, w[prefix + "kv_a_norm"], latent_arch.norm_eps)
    k_rope = apply_rotary(k_rope.unsqueeze(1), shared.cos, shared.sin).squeeze(1)
    torch.ops.helios.latent_cache_write(shared.k_cache[layer], shared.v_cache[layer], latent.contiguous(),
                                        k_rope.contiguous(), shared.step.slot_mapping)


def _queries(arch: Architecture, w, prefix: str, hidden):
    """(q_nope [T, Hq, Dn], q_rope [T, Hq, Dr], the normed query latent [T, Q] or None without a
    query rank) of the packed tokens."""
    latent, compressed = arch.latent, None
    if latent.q_lora_rank:
        compressed = rms_norm(F.linear(hidden, w[prefix + "q_a.weight"]), w[prefix + "q_a_norm"], latent.norm_eps)
        q = F.linear(compressed, w[prefix + "q_b.weight"])
    else:
        q = F.linear(hidden, w[prefix + "q.weight"])
    q = q.view(hidden.shape[0], arch.num_heads, latent.qk_head_dim)
    return (*q.split([latent.qk_nope_head_dim, latent.qk_rope_head_dim], dim=-1), compressed)


def _absorbed(arch: Architecture, kv_b, q_nope, q_rope, planes, step, selected=None) -> torch.Tensor:
    """[T, Hq, Dv]: attention over the latent cache with the up-projections folded into q and out;
    with `selected` (int64 [T, K] positions, -1 none) over those positions only."""
    nope = arch.latent.qk_nope_head_dim
    w_uk, w_uv = kv_b[:, :nope], kv_b[:, nope:]  # [Hq, Dn, C], [Hq, Dv, C]
    q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, Hq, C]
    geometry = (q_latent.contiguous(), q_rope.contiguous(), planes[0], planes[1], step.page_table, step.query_start,
                step.positions)
    if selected is None:
        attended = torch.ops.helios.paged_latent_attention(*geometry, arch.attention_scale)
    else:
        attended = torch.ops.helios.paged_latent_attention_selected(*geometry, selected, arch.attention_scale)
    return torch.bmm(attended.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


def _up_projected(arch: Architecture, kv_b, q_nope, q_rope, planes, step) -> torch.Tensor:
    """[T, Hq, Dv]: per-head keys and values up-projected from the rows' gathered latent pages."""
    latent_arch, heads = arch.latent, arch.num_heads
    latent_plane, rope_plane = planes
    rows, max_pages = step.page_table.shape
    pages = step.page_table.clamp(0, latent_plane.shape[0] - 1).to(torch.int64).reshape(-1)
    page_tokens = latent_plane.shape[1]
    latents = latent_plane[pages]  # [rows * max_pages, page_tokens, C]
    rope = rope_plane[pages].unsqueeze(2).expand(-1, -1, heads, -1)
    kv = F.linear(latents, kv_b.reshape(-1, latent_arch.kv_lora_rank))
    k_nope, values = kv.view(-1, page_tokens, heads, kv_b.shape[1]).split(
        [latent_arch.qk_nope_head_dim, latent_arch.v_head_dim], dim=-1)
    keys = torch.cat((k_nope, rope), dim=-1)
    queries = torch.cat((q_nope, q_rope), dim=-1)
    width = max(keys.shape[-1], values.shape[-1])  # paged_attention reads keys and values of one width
    keys, queries, values = (F.pad(x, (0, width - x.shape[-1])) for x in (keys, queries, values))
    table = torch.arange(rows * max_pages, device=pages.device, dtype=torch.int32).view(rows, max_pages)
    attended = torch.ops.helios.paged_attention(
        queries.contiguous(), keys.contiguous(), values.contiguous(), table, step.query_start, step.positions,
        arch.attention_scale, 0)
    return attended[..., :latent_arch.v_head_dim]

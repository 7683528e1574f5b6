"""The Qwen2.5-VL vision encoder as a pure function of named weights, capturable at a patch capacity.

Inputs are the SPATIAL_POSITIONS_3D layout's vision tensors (see `helios.frontend.images.layout`):
patches already in window order, their (row, column) rotary positions, window and image segment
ids, and the feature order undoing the window permutation. Attention is masked to the segment
(window segments on windowed blocks, image segments on the full-attention blocks), which equals
the reference's per-window attention; padding patches form a segment of their own, so a fixed
capacity needs no dynamic shapes. The merger (RMS norm, MLP over merge units) projects to the
language model's width. Arithmetic follows the reference order in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from helios.ignition.recipes.base import NamedWeight, UnsupportedCheckpoint


@dataclass(frozen=True)
class VisionArchitecture:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    window_size: int
    out_hidden_size: int
    full_attention_blocks: tuple[int, ...]
    rope_theta: float = 10000.0
    in_channels: int = 3

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_width(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size


def vision_architecture(config: Mapping[str, Any]) -> VisionArchitecture:
    """The vision encoder's geometry from a checkpoint's `vision_config`."""
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"vision hidden_act {config.get('hidden_act')!r} is not supported")
    rope = config.get("rope_parameters") or {}
    return VisionArchitecture(
        depth=int(config["depth"]), hidden_size=int(config["hidden_size"]), num_heads=int(config["num_heads"]),
        intermediate_size=int(config["intermediate_size"]), patch_size=int(config["patch_size"]),
        temporal_patch_size=int(config.get("temporal_patch_size", 2)),
        merge_size=int(config.get("spatial_merge_size", 2)), window_size=int(config["window_size"]),
        out_hidden_size=int(config["out_hidden_size"]),
        full_attention_blocks=tuple(int(i) for i in config.get("fullatt_block_indexes", ())),
        rope_theta=float(rope.get("rope_theta", 10000.0)), in_channels=int(config.get("in_channels", 3)))


def vision_weights(arch: VisionArchitecture, take, prefix: str = "model.visual.") -> list[NamedWeight]:
    """The encoder's weights in program layout (`take` reads a checkpoint tensor by name)."""
    out = [NamedWeight("vision.patch_embed", take(prefix + "patch_embed.proj.weight").reshape(arch.hidden_size, -1))]
    for block in range(arch.depth):
        src, dst = f"{prefix}blocks.{block}.", f"vision.blocks.{block}."
        for name in ("norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                     "attn.proj.bias", "mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.weight",
                     "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"):
            out.append(NamedWeight(dst + name, take(src + name)))
    for name in ("ln_q.weight", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"):
        out.append(NamedWeight("vision.merger." + name, take(prefix + "merger." + name)))
    half = arch.head_dim // 2
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float) / half))
    out.append(NamedWeight("vision.rope.inv_freq", inv_freq))
    return out


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attention(arch, w, prefix, hidden, cos, sin, mask):
    patches = hidden.shape[0]
    qkv = F.linear(hidden, w[prefix + "attn.qkv.weight"], w[prefix + "attn.qkv.bias"])
    q, k, v = qkv.reshape(patches, 3, arch.num_heads, arch.head_dim).permute(1, 0, 2, 3).unbind(0)
    dtype = q.dtype
    q, k = q.float(), k.float()
    q = (q * cos + _rotate_half(q) * sin).to(dtype).transpose(0, 1)
    k = (k * cos + _rotate_half(k) * sin).to(dtype).transpose(0, 1)
    out = F.scaled_dot_product_attention(q, k, v.transpose(0, 1), attn_mask=mask, scale=arch.head_dim ** -0.5)
    out = out.transpose(0, 1).reshape(patches, arch.hidden_size)
    return F.linear(out, w[prefix + "attn.proj.weight"], w[prefix + "attn.proj.bias"])


def _mlp(w, prefix, hidden):
    gate = F.linear(hidden, w[prefix + "mlp.gate_proj.weight"], w[prefix + "mlp.gate_proj.bias"])
    up = F.linear(hidden, w[prefix + "mlp.up_proj.weight"], w[prefix + "mlp.up_proj.bias"])
    return F.linear(F.silu(gate) * up, w[prefix + "mlp.down_proj.weight"], w[prefix + "mlp.down_proj.bias"])


def vision_features(arch: VisionArchitecture, w: Mapping[str, torch.Tensor], pixel_patches, rotary_positions,
                    window_segments, image_segments, feature_order) -> torch.Tensor:
    """Features [capacity / merge^2, out_hidden_size] in image order (padding features last)."""
    dtype = w["vision.patch_embed"].dtype
    hidden = F.linear(pixel_patches.to(dtype), w["vision.patch_embed"])
    freqs = rotary_positions.to(torch.float32)[..., None] * w["vision.rope.inv_freq"].to(torch.float32)
    angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]
    cos, sin = angles.cos(), angles.sin()
    window_mask = window_segments[:, None] == window_segments[None, :]
    image_mask = image_segments[:, None] == image_segments[None, :]
    for block in range(arch.depth):
        prefix = f"vision.blocks.{block}."
        mask = image_mask if block in arch.full_attention_blocks else window_mask
        hidden = hidden + _attention(arch, w, prefix, _rms(hidden, w[prefix + "norm1.weight"]), cos, sin, mask)
        hidden = hidden + _mlp(w, prefix, _rms(hidden, w[prefix + "norm2.weight"]))
    merged = _rms(hidden, w["vision.merger.ln_q.weight"]).reshape(-1, arch.hidden_size * arch.merge_size ** 2)
    merged = F.linear(merged, w["vision.merger.mlp.0.weight"], w["vision.merger.mlp.0.bias"])
    merged = F.linear(F.gelu(merged), w["vision.merger.mlp.2.weight"], w["vision.merger.mlp.2.bias"])
    return merged[feature_order]

"""The Qwen2.5-VL and Qwen3-VL vision encoders as pure functions of named weights, capturable at a
patch capacity.

Inputs are the SPATIAL_POSITIONS_3D layout's vision tensors (see `helios.frontend.images.layout`):
patches already in window order, their (row, column) rotary positions, window and image segment
ids, and the feature order undoing the window permutation. Attention is masked to the segment
(window segments on windowed blocks, image segments on the full-attention blocks), which equals
the reference's per-window attention; padding patches form a segment of their own, so a fixed
capacity needs no dynamic shapes. The merger (RMS norm, MLP over merge units) projects to the
language model's width. Arithmetic follows the reference order in float32.

Qwen3-VL (`QWEN3_VL`): LayerNorm blocks with a tanh-GELU MLP, every block attending over its whole
image (its windows are single merge units, so the layout's order is the reference's), a patch
embedding with bias plus a learned position grid resampled bilinearly (align corners) to each
image's patch grid (the grid's height and width are the largest row and column of the image's
segment), a LayerNorm merger, and DeepStack: after each of `deepstack_blocks` a merger of its own
(norm after the merge-unit shuffle) projects that block's output too. Its features are
[main, deepstack 0, deepstack 1, ...] side by side: `feature_width` = out_hidden_size * (1 + k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from helios.ignition.architecture import CheckpointError
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
    family: str = "qwen2_5_vl"  # QWEN2_5_VL or QWEN3_VL: which encoder `vision_features` runs
    num_position_embeddings: int = 0  # Qwen3-VL: the learned position grid's entries (a square)
    deepstack_blocks: tuple[int, ...] = ()  # Qwen3-VL: blocks whose outputs feed the decoder's first layers

    @property
    def feature_width(self) -> int:
        """Columns of one encoded feature: the merger's output, then each DeepStack merger's."""
        return self.out_hidden_size * (1 + len(self.deepstack_blocks))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_width(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size


QWEN2_5_VL, QWEN3_VL = "qwen2_5_vl", "qwen3_vl"
# Frames of one patch: the contract's image preparation carries no temporal size, and the frontend
# repeats a still image over 2 (`helios.frontend.images.preparation.TEMPORAL_PATCH_SIZE`); an encoder
# of another temporal size would be handed patches of the wrong width at the first image.
STILL_FRAMES = 2
RGB_CHANNELS = 3  # the served image preparation converts every image to RGB

# transformers 5's vision config class defaults, which it takes for the keys a `vision_config` leaves
# out (`recipes.defaults` does the same for decoders): a config.json that left Qwen2.5-VL's
# full-attention blocks to their default ([7, 15, 23, 31]) prepared an encoder that attended by
# windows in every block, and one that left out Qwen3-VL's DeepStack blocks or a window_size was refused.
REFERENCE_VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    QWEN2_5_VL: {"depth": 32, "hidden_size": 3584, "hidden_act": "silu", "intermediate_size": 3420, "num_heads": 16,
                 "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                 "window_size": 112, "out_hidden_size": 3584, "fullatt_block_indexes": [7, 15, 23, 31]},
    QWEN3_VL: {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
               "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
               "out_hidden_size": 3584, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]},
}


def vision_architecture(config: Mapping[str, Any], family: str = QWEN2_5_VL) -> VisionArchitecture:
    """The vision encoder's geometry from a checkpoint's `vision_config` (its missing keys read as
    transformers reads them: `REFERENCE_VISION_DEFAULTS`)."""
    config = {**REFERENCE_VISION_DEFAULTS[family], **config}
    # A null is taken as given, as transformers' config classes take it (its model then fails to build);
    # int(None) failed here with a traceback.
    nulls = [key for key, default in REFERENCE_VISION_DEFAULTS[family].items()
             if isinstance(default, int) and config[key] is None]
    if nulls:
        raise CheckpointError(f"vision_config.{nulls[0]} is null; it must be a positive integer")
    if int(config["temporal_patch_size"]) != STILL_FRAMES:
        raise UnsupportedCheckpoint(f"vision temporal_patch_size {config['temporal_patch_size']!r} is not supported: "
                                    f"the served image preparation fills {STILL_FRAMES} temporal frames per patch")
    if config["in_channels"] != RGB_CHANNELS:
        raise UnsupportedCheckpoint(f"vision in_channels {config['in_channels']!r} is not supported: the served image "
                                    f"preparation makes patches of {RGB_CHANNELS} (RGB) channels")
    if family == QWEN3_VL:
        return _qwen3_architecture(config)
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"vision hidden_act {config.get('hidden_act')!r} is not supported")
    # Windows hold window_size // merge // patch merged patches a side (transformers floors it too); one
    # smaller than a merged patch holds none, which failed only at capture.
    patch, merge, window = int(config["patch_size"]), int(config["spatial_merge_size"]), int(config["window_size"])
    if window < patch * merge:
        raise UnsupportedCheckpoint(f"vision_config.window_size {window} is smaller than a merged patch (patch_size "
                                    f"{patch} x spatial_merge_size {merge} = {patch * merge}): windows hold no patch")
    rope = config.get("rope_parameters") or {}
    return VisionArchitecture(
        depth=int(config["depth"]), hidden_size=int(config["hidden_size"]), num_heads=int(config["num_heads"]),
        intermediate_size=int(config["intermediate_size"]), patch_size=int(config["patch_size"]),
        temporal_patch_size=int(config.get("temporal_patch_size", 2)),
        merge_size=int(config.get("spatial_merge_size", 2)), window_size=int(config["window_size"]),
        out_hidden_size=int(config["out_hidden_size"]),
        full_attention_blocks=tuple(int(i) for i in config.get("fullatt_block_indexes", ())),
        rope_theta=float(rope.get("rope_theta", 10000.0)), in_channels=int(config.get("in_channels", 3)))


def _qwen3_architecture(config: Mapping[str, Any]) -> VisionArchitecture:
    if config.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise UnsupportedCheckpoint(f"Qwen3-VL vision hidden_act {config.get('hidden_act')!r} is not supported")
    depth, patch, merge = int(config["depth"]), int(config["patch_size"]), int(config.get("spatial_merge_size", 2))
    positions = int(config["num_position_embeddings"])
    if int(positions ** 0.5) ** 2 != positions:
        raise UnsupportedCheckpoint(f"num_position_embeddings {positions} is not a square grid")
    # Each index names a block whose output a merger of its own adds after one of the decoder's first
    # layers; one outside the blocks (transformers skips it, its merger unused) or named twice gave the
    # features fewer DeepStack blocks than `feature_width` counts, which failed late, at capture.
    stacked = tuple(int(i) for i in config.get("deepstack_visual_indexes", ()))
    if any(not 0 <= i < depth for i in stacked) or len(set(stacked)) != len(stacked):
        raise UnsupportedCheckpoint(f"deepstack_visual_indexes {list(stacked)} must be distinct blocks of the "
                                    f"vision encoder's depth {depth} (0 to {depth - 1})")
    rope = config.get("rope_parameters") or {}
    return VisionArchitecture(
        depth=depth, hidden_size=int(config["hidden_size"]), num_heads=int(config["num_heads"]),
        intermediate_size=int(config["intermediate_size"]), patch_size=patch,
        temporal_patch_size=int(config.get("temporal_patch_size", 2)), merge_size=merge,
        window_size=patch * merge, out_hidden_size=int(config["out_hidden_size"]),
        full_attention_blocks=tuple(range(depth)), rope_theta=float(rope.get("rope_theta", 10000.0)),
        in_channels=int(config.get("in_channels", 3)), family=QWEN3_VL, num_position_embeddings=positions,
        deepstack_blocks=stacked)


def vision_weights(arch: VisionArchitecture, take, prefix: str = "model.visual.") -> list[NamedWeight]:
    """The encoder's weights in program layout (`take` reads a checkpoint tensor by name)."""
    if arch.family == QWEN3_VL:
        return _qwen3_weights(arch, take, prefix)
    out = [_patch_embed(arch, take, prefix)]
    for block in range(arch.depth):
        src, dst = f"{prefix}blocks.{block}.", f"vision.blocks.{block}."
        for name in ("norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                     "attn.proj.bias", "mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.weight",
                     "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"):
            out.append(NamedWeight(dst + name, take(src + name)))
    for name in ("ln_q.weight", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"):
        out.append(NamedWeight("vision.merger." + name, take(prefix + "merger." + name)))
    out.append(_rope_inv_freq(arch))
    return out


def _patch_embed(arch: VisionArchitecture, take, prefix: str) -> NamedWeight:
    """The patch embedding as one matrix over a patch's pixels, whose shape must be the patch geometry
    of the config (which the served frontend cuts patches by): transformers refuses to load a weight
    of another shape, and its flattened columns were taken as a patch's pixels, failing capture with a
    traceback (or, columns equal in number, reading each patch's pixels in another order)."""
    name = prefix + "patch_embed.proj.weight"
    weight = take(name)
    expected = (arch.hidden_size, arch.in_channels, arch.temporal_patch_size, arch.patch_size, arch.patch_size)
    if tuple(weight.shape) != expected:
        raise CheckpointError(f"tensor {name} is {list(weight.shape)}, not {list(expected)}: vision_config's "
                              f"hidden_size, in_channels, temporal_patch_size, patch_size and patch_size")
    return NamedWeight("vision.patch_embed", weight.reshape(arch.hidden_size, -1))


def _rope_inv_freq(arch: VisionArchitecture) -> NamedWeight:
    half = arch.head_dim // 2
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float) / half))
    return NamedWeight("vision.rope.inv_freq", inv_freq)


def _qwen3_weights(arch: VisionArchitecture, take, prefix: str) -> list[NamedWeight]:
    out = [_patch_embed(arch, take, prefix),
           NamedWeight("vision.patch_embed.bias", take(prefix + "patch_embed.proj.bias")),
           NamedWeight("vision.pos_embed", take(prefix + "pos_embed.weight"))]
    for block in range(arch.depth):
        src, dst = f"{prefix}blocks.{block}.", f"vision.blocks.{block}."
        for name in ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.qkv.weight", "attn.qkv.bias",
                     "attn.proj.weight", "attn.proj.bias", "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
                     "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"):
            out.append(NamedWeight(dst + name, take(src + name)))
    mergers = [("merger.", "vision.merger.")]
    mergers += [(f"deepstack_merger_list.{j}.", f"vision.deepstack.{j}.") for j in range(len(arch.deepstack_blocks))]
    for src, dst in mergers:
        for name in ("norm.weight", "norm.bias", "linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight",
                     "linear_fc2.bias"):
            out.append(NamedWeight(dst + name, take(prefix + src + name)))
    out.append(_rope_inv_freq(arch))
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


def _rotary(arch: VisionArchitecture, w, rotary_positions):
    freqs = rotary_positions.to(torch.float32)[..., None] * w["vision.rope.inv_freq"].to(torch.float32)
    angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]
    return angles.cos(), angles.sin()


def vision_features(arch: VisionArchitecture, w: Mapping[str, torch.Tensor], pixel_patches, rotary_positions,
                    window_segments, image_segments, feature_order) -> torch.Tensor:
    """Features [capacity / merge^2, feature_width] in image order (padding features last)."""
    if arch.family == QWEN3_VL:
        return _qwen3_features(arch, w, pixel_patches, rotary_positions, image_segments, feature_order)
    dtype = w["vision.patch_embed"].dtype
    hidden = F.linear(pixel_patches.to(dtype), w["vision.patch_embed"])
    cos, sin = _rotary(arch, w, rotary_positions)
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


def _layer_norm(x: torch.Tensor, w, name: str) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w[name + ".weight"], w[name + ".bias"], 1e-6)


def _axis_taps(index: torch.Tensor, size: torch.Tensor, side: int):
    """Bilinear (align corners) taps into a `side`-long axis and their weights, [P, 2] each."""
    src = index.to(torch.float32) * (side - 1) / torch.clamp(size - 1, min=1)
    floor = torch.floor(src)
    offsets = torch.arange(0, 2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def _grid_positions(arch: VisionArchitecture, w, rotary_positions, image_segments) -> torch.Tensor:
    """The learned position grid resampled to each patch's image grid, [P, hidden]."""
    rows, cols = rotary_positions[:, 0], rotary_positions[:, 1]
    segments = image_segments.long()
    heights = torch.zeros_like(rows).scatter_reduce(0, segments, rows, "amax") + 1
    widths = torch.zeros_like(cols).scatter_reduce(0, segments, cols, "amax") + 1
    side = int(arch.num_position_embeddings ** 0.5)
    h_taps, h_weights = _axis_taps(rows, heights[segments], side)
    w_taps, w_weights = _axis_taps(cols, widths[segments], side)
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
    return (w["vision.pos_embed"][indices] * weights[:, :, None]).sum(1)


def _merge(arch: VisionArchitecture, w, prefix: str, hidden: torch.Tensor, postshuffle: bool) -> torch.Tensor:
    width = arch.hidden_size * arch.merge_size ** 2
    merged = _layer_norm(hidden.reshape(-1, width), w, prefix + "norm") if postshuffle else (
        _layer_norm(hidden, w, prefix + "norm").reshape(-1, width))
    merged = F.gelu(F.linear(merged, w[prefix + "linear_fc1.weight"], w[prefix + "linear_fc1.bias"]))
    return F.linear(merged, w[prefix + "linear_fc2.weight"], w[prefix + "linear_fc2.bias"])


def _qwen3_features(arch: VisionArchitecture, w, pixel_patches, rotary_positions, image_segments, feature_order):
    dtype = w["vision.patch_embed"].dtype
    hidden = F.linear(pixel_patches.to(dtype), w["vision.patch_embed"], w["vision.patch_embed.bias"])
    hidden = hidden + _grid_positions(arch, w, rotary_positions, image_segments).to(hidden.dtype)
    cos, sin = _rotary(arch, w, rotary_positions)
    mask = image_segments[:, None] == image_segments[None, :]
    stacked = []
    for block in range(arch.depth):
        prefix = f"vision.blocks.{block}."
        hidden = hidden + _attention(arch, w, prefix, _layer_norm(hidden, w, prefix + "norm1"), cos, sin, mask)
        up = F.linear(_layer_norm(hidden, w, prefix + "norm2"), w[prefix + "mlp.linear_fc1.weight"],
                      w[prefix + "mlp.linear_fc1.bias"])
        hidden = hidden + F.linear(F.gelu(up, approximate="tanh"), w[prefix + "mlp.linear_fc2.weight"],
                                   w[prefix + "mlp.linear_fc2.bias"])
        if block in arch.deepstack_blocks:
            j = arch.deepstack_blocks.index(block)
            stacked.append(_merge(arch, w, f"vision.deepstack.{j}.", hidden, postshuffle=True))
    features = torch.cat([_merge(arch, w, "vision.merger.", hidden, postshuffle=False), *stacked], dim=-1)
    return features[feature_order]

"""The dense decoder with image features and multimodal rotary positions (mrope).

Two differences from `decoder.decoder_hidden`: vision features replace the embeddings of the image
placeholder tokens (a per-token feature slot, -1 for text), and the rotary angle of each frequency
takes one of three position components (temporal, height, width) by the checkpoint's
`mrope_section`, while the cache position (causality, slots) stays the token's sequence index.
Everything else (attention with cache writes, MLP, fused norms) is the shared decoder's.
"""

from __future__ import annotations

from typing import Sequence

import torch

from helios.ignition.architecture import CheckpointError
from helios.ignition.decoder import LayerInputs, PackedStep, attention_block, mlp_block, rms_norm
from helios.ignition.tensor_parallel import embed_tokens


def mrope_components(mrope_section: Sequence[int], interleaved: bool = False) -> torch.Tensor:
    """Position component (0 temporal, 1 height, 2 width) of each rotary frequency, int64 [D / 2]:
    sections one after another, or (Qwen3-VL's `mrope_interleaved`) frequency j takes component
    j % 3 while j < 3 * that component's section, else the temporal one."""
    if not interleaved:
        return torch.cat([torch.full((int(size),), i % 3, dtype=torch.int64)
                          for i, size in enumerate(mrope_section)])
    components = torch.zeros(sum(int(size) for size in mrope_section), dtype=torch.int64)
    for component in (1, 2):
        components[component:3 * int(mrope_section[component]):3] = component
    return components


def mrope_tables(rotary_positions: torch.Tensor, inv_freq: torch.Tensor, components: torch.Tensor, dtype):
    """cos and sin [T, 1, D] from 3-component positions [T, 3] (frequency j rotates by component
    components[j]; the reference computes all three and selects sections, the same products)."""
    chosen = rotary_positions.to(torch.float32)[:, components]  # [T, D / 2]
    freqs = chosen * inv_freq[None, :].to(torch.float32)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


def embed_with_features(arch, w, token_ids, features: torch.Tensor, feature_slots: torch.Tensor):
    """Token embeddings [T, H] with row t replaced by features[feature_slots[t], :H] where it is >= 0."""
    hidden = embed_tokens(arch, w["embed"], w.get("vocab.start"), token_ids)
    gathered = features[:, :arch.hidden_size].to(hidden.dtype)[feature_slots.clamp(min=0)]
    return torch.where((feature_slots >= 0)[:, None], gathered, hidden)


def add_deepstack(arch, hidden: torch.Tensor, features: torch.Tensor, feature_slots: torch.Tensor,
                  layer: int) -> torch.Tensor:
    """DeepStack (Qwen3-VL): after decoder layer `layer` < k, feature tokens add their feature's
    column block 1 + layer (features are [F, (1 + k) * H])."""
    start = (1 + layer) * arch.hidden_size
    gathered = features[:, start:start + arch.hidden_size].to(hidden.dtype)[feature_slots.clamp(min=0)]
    return torch.where((feature_slots >= 0)[:, None], hidden + gathered, hidden)


def multimodal_decoder_hidden(arch, w, k_cache, v_cache, step: PackedStep, rotary_positions: torch.Tensor,
                              features: torch.Tensor | None = None,
                              feature_slots: torch.Tensor | None = None,
                              rows: torch.Tensor | None = None) -> torch.Tensor:
    """Final-normed hidden states [T, H]; mutates the cache planes in place. Without `features`
    (one-token decode) every token takes its own embedding; features wider than H carry DeepStack
    blocks added after the first layers (`add_deepstack`). With `rows` (packed token indices, [N]):
    the states [N, H] of those tokens alone, the last layer's output projection and MLP run on them
    only (`helios.ignition.decoder.decoder_hidden`), unless DeepStack adds to the last layer."""
    if arch.sandwich_norms or arch.local_rope_layers:  # (Gemma's; its multimodal checkpoints are not prepared)
        raise CheckpointError("a multimodal decoder has no sandwich norms or local rope layers")
    num_stacked = 0
    if features is None:
        hidden = embed_tokens(arch, w["embed"], w.get("vocab.start"), step.token_ids)
    else:
        hidden = embed_with_features(arch, w, step.token_ids, features, feature_slots)
        num_stacked = features.shape[1] // arch.hidden_size - 1
    cos, sin = mrope_tables(rotary_positions, w["rope.inv_freq"], w["rope.mrope_components"], hidden.dtype)
    shared = LayerInputs(step, k_cache, v_cache, cos, sin)
    normed = rms_norm(hidden, w["layers.0.input_norm"], arch.rms_norm_eps)
    update = torch.ops.helios.add_rms_norm
    last = arch.num_layers - 1
    kept = rows if last >= num_stacked else None  # (DeepStack rows are per packed token)
    for layer in range(arch.num_layers):
        prefix = f"layers.{layer}."
        selected = kept if layer == last else None
        attended = attention_block(arch, w, layer, normed, shared, rows=selected)
        if selected is not None:
            hidden = hidden[selected]
        hidden, normed = update(hidden, attended, w[prefix + "post_norm"], arch.rms_norm_eps)
        next_norm = w[f"layers.{layer + 1}.input_norm"] if layer + 1 < arch.num_layers else w["final_norm"]
        hidden, normed = update(hidden, mlp_block(arch, w, prefix, normed), next_norm, arch.rms_norm_eps)
        if layer < num_stacked:
            hidden = add_deepstack(arch, hidden, features, feature_slots, layer)
            normed = rms_norm(hidden, next_norm, arch.rms_norm_eps)
    return normed if rows is None or kept is not None else normed[rows]

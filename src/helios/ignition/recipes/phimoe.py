"""Recipe for PhiMoE checkpoints (PhimoeForCausalLM: Phi-3.5-MoE).

Read as PhimoeConfig and PhimoeModel read them: LayerNorms with biases (epsilon ``rms_norm_eps``;
`Architecture.layer_norm`, ``norm_bias``, placed as StarCoder2's), Llama's attention with q/k/v/o
biases where ``attention_bias``, a sliding window on every layer where ``sliding_window`` is set, an
``lm_head`` bias where ``lm_head_bias`` (`Architecture.head_bias`), and a mixture of experts in every
layer: SparseMixer top-2 routing of the ``block_sparse_moe.gate`` logits with the threshold
``router_jitter_noise`` (``helios::moe_route_sparsemixer``; the reference picks two experts whatever
``num_experts_per_tok`` says, so another count is refused), experts ``w1`` (gate) / ``w3`` (up) /
``w2`` (down) of width ``intermediate_size``, stacked as Mixtral's (`moe.sparse_weights`).

Rotary embeddings: "default", or "longrope" as PhimoeRotaryEmbedding computes it, which differs from
Phi-3's: its frequencies are always the short factors' (it calls the rope initialiser without a
sequence length), and cos / sin are multiplied by ``short_mscale``, or ``long_mscale`` once a forward's
longest position passes ``original_max_position_embeddings``. Phi-3.5-MoE sets both mscales alike; a
config whose two differ is refused by name (a core holds one table; the reference switches per
forward). Keys config.json leaves out take PhimoeConfig's defaults.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama, moe, starcoder2
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("PhimoeForCausalLM",)
_NAMES = moe.ExpertNames("block_sparse_moe.", "w1", "w3", "w2", router="gate.weight")
# PhimoeConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"rms_norm_eps": 1e-5, "num_key_value_heads": 8, "num_local_experts": 16, "num_experts_per_tok": 2,
             "router_jitter_noise": 0.01, "sliding_window": None, "lm_head_bias": False, "attention_bias": False,
             "rope_theta": 1e6}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    top_k, eps = config["num_experts_per_tok"], config["router_jitter_noise"]
    if top_k != 2:
        raise UnsupportedCheckpoint(f"config.json: num_experts_per_tok {top_k!r} is not supported (the reference's "
                                    f"SparseMixer routing always picks 2 experts)")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise UnsupportedCheckpoint(f"config.json: router_jitter_noise {eps!r} must be a finite number >= 0")
    window = config["sliding_window"]
    # Llama's attention without its windows (PhiMoE's reference reads neither layer_types nor the Qwen
    # switch: every layer slides over sliding_window, set below) and with a plain rope (the rope: below).
    plain = {**config, "layer_types": None, "sliding_window": None, "use_sliding_window": None, "rope_scaling": None,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    base = llama.architecture_from_config(source, plain, tensors, dtype)
    inv_freq, factor = _rope(config, base.head_dim)
    experts = MixtureOfExperts(int(config["num_local_experts"]), 2, int(config["intermediate_size"]),
                               tuple(range(base.num_layers)), scoring="sparsemixer", normalize=False,
                               jitter_eps=float(eps))
    arch = dataclasses.replace(base, moe=experts, intermediate_size=0, layer_norm=True, norm_bias=True,
                               head_bias=bool(config["lm_head_bias"]), rotary_factor=factor,
                               layer_windows=(_window(window),) * base.num_layers)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return (starcoder2.layer_norm_attention_weights(arch, layer, take)
                + moe.sparse_weights(arch, layer, take, tensors, _NAMES))

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq)
    weights, used = starcoder2.with_final_norm_bias(arch, weights, used, tensors)
    if arch.head_bias:
        head = "final_norm_bias" if arch.tie_word_embeddings else "lm_head"  # the bias follows the head's slot
        after = next(index for index, weight in enumerate(weights) if weight.name == head) + 1
        used.add("lm_head.bias")
        weights = weights[:after] + (NamedWeight("lm_head_bias", tensors.get("lm_head.bias").to(arch.torch_dtype)),) \
            + weights[after:]
    return llama.placed_recipe(source, arch, weights, used, tensors)


def _window(window) -> int:
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UnsupportedCheckpoint(f"config.json: sliding_window {window!r} must be a positive count or null")
    return window


def _rope(config: Mapping[str, Any], head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2], the cos/sin factor) as PhimoeRotaryEmbedding computes them."""
    params = llama.rope_settings(config)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "longrope":
        return llama.rope_inv_freq(config, head_dim), llama.rope_attention_factor(config)
    short, long_ = params.get("short_mscale"), params.get("long_mscale")
    if not all(isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) for m in (short, long_)):
        raise UnsupportedCheckpoint(f"config.json: longrope needs numeric short_mscale and long_mscale, got "
                                    f"{short!r} and {long_!r}")
    if short != long_:
        raise UnsupportedCheckpoint(f"config.json: short_mscale {short} and long_mscale {long_} differ (the reference "
                                    f"switches between them by each forward's length; a core holds one table)")
    factors = params.get("short_factor")
    if not isinstance(factors, list) or len(factors) != head_dim // 2 or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors):
        raise UnsupportedCheckpoint(f"config.json: short_factor must list {head_dim // 2} positive factors")
    if params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedCheckpoint("partial_rotary_factor is not supported (the reference rotates whole heads)")
    theta = params.get("rope_theta", config.get("rope_theta"))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * float(theta) ** exponents)
    return inv_freq, float(short)

"""Recipe for Hunyuan dense checkpoints (HunYuanDenseV1ForCausalLM).

The decoder is Llama's (the llama recipe prepares its weights; ``attention_bias`` puts a bias on q,
k, v and o, taken from what the checkpoint holds; full causal attention), with per-head RMS norms
on the queries and keys (``self_attn.query_layernorm`` / ``key_layernorm``) that HunYuan applies
after the rotation, where Qwen3 applies them before: `Architecture.qk_norm_after_rotary`.

Rope: HunYuan checkpoints spell NTK-alpha scaling as rope type "dynamic" with an ``alpha``; the
reference reads that as a static stretch of the base, theta * alpha ** (D / (D - 2)) (its
"ntk_alpha" type), which the prepared core holds as default rope frequencies of that base. Rope
type "dynamic" without an alpha (sequence-length-dependent NTK) is refused, as for Llama; the
others are Llama's. ``head_dim`` must be given: the reference sizes its heads and norms by it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("HunYuanDenseV1ForCausalLM",)
_NORM_NAMES = {"self_attn.q_norm.weight": "self_attn.query_layernorm.weight",
               "self_attn.k_norm.weight": "self_attn.key_layernorm.weight"}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    check_head_dim(config)
    config = with_static_rope(config)
    arch = llama.architecture_from_config(source, config, tensors, dtype)
    arch = dataclasses.replace(arch, qk_norm=True, qk_norm_after_rotary=True)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return attention_weights(arch, layer, take) + llama.dense_mlp_weights(arch, layer, take)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def attention_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """Llama's attention slots of `layer`, the q/k norms read from HunYuan's ``query_layernorm`` /
    ``key_layernorm`` (shared with `helios.ignition.recipes.hunyuan_moe`)."""
    def renamed(name: str):
        for ours, theirs in _NORM_NAMES.items():
            if name.endswith(ours):
                return take(name.removesuffix(ours) + theirs)
        return take(name)

    return llama.attention_weights(arch, layer, renamed)


def check_head_dim(config: Mapping[str, Any]) -> None:
    """An UnsupportedCheckpoint unless config.json gives an integer head_dim (the reference sizes its
    heads and q/k norms by it)."""
    if not isinstance(config.get("head_dim"), int) or isinstance(config.get("head_dim"), bool):
        raise UnsupportedCheckpoint(f"config.json: head_dim must be an integer (the HunYuan reference sizes heads "
                                    f"by it), got {config.get('head_dim')!r}")


def with_static_rope(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """`config` with a "dynamic" rope that has an ``alpha`` rewritten as the default rope of the
    stretched base the reference computes (the same float arithmetic); other ropes unchanged."""
    params = llama.rope_settings(config)
    if params.get("rope_type", params.get("type")) != "dynamic" or not params.get("alpha"):
        return config
    alpha, dim = params["alpha"], config["head_dim"]
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0 or dim <= 2:
        raise UnsupportedCheckpoint(f"config.json: rope alpha {alpha!r} must be a positive number (and head_dim "
                                    f"above 2) for NTK-alpha rope")
    if theta is None:
        raise UnsupportedCheckpoint("config.json: rope_theta must be a positive number, got null")
    base = theta * alpha ** (dim / (dim - 2))
    if not math.isfinite(base) or not base > 0:
        raise UnsupportedCheckpoint(f"config.json: rope alpha {alpha} stretches rope_theta {theta} past a float")
    rope = {"rope_type": "default", "rope_theta": base}
    if "partial_rotary_factor" in params:  # the reference's NTK-alpha rotates whole heads whatever it says
        rope["partial_rotary_factor"] = params["partial_rotary_factor"]
    return {**config, "rope_scaling": None, "rope_parameters": rope}

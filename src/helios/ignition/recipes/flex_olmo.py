"""Recipe for FlexOlmo checkpoints (FlexOlmoForCausalLM, transformers' FlexOlmoConfig).

OLMo 2's block (`helios.ignition.recipes.olmo`: no norm before the attention or the MLP, their outputs
normed by ``post_attention_layernorm`` / ``post_feedforward_layernorm`` before the residual adds,
q/k RMS norms over the whole q and k projections before the rotation) with OLMoE's mixture in every
layer (`helios.ignition.recipes.olmoe`): a softmax over ``mlp.gate.weight``'s logits, the top
``num_experts_per_tok`` of ``num_experts`` experts of width ``intermediate_size``, renormalised only
where ``norm_topk_prob``; no shared expert.

FlexOlmoConfig's defaults fill the keys config.json leaves out (rope theta 500000, epsilon 1e-6,
7 experts, top 5, unnormalised). Refused by name: another ``hidden_act``, a partial rotary factor,
rope types other than Llama's, a checkpoint without q/k norm tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama, moe, olmo
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("FlexOlmoForCausalLM",)
_NAMES = moe.ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj")
# FlexOlmoConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"rms_norm_eps": 1e-6, "num_experts": 7, "num_experts_per_tok": 5, "norm_topk_prob": False}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **{key: value for key, value in config.items() if key not in _UNREAD}}
    if "rope_parameters" not in config and "rope_scaling" not in config:
        config.setdefault("rope_theta", 500_000.0)  # FlexOlmoConfig.default_theta
    for key in ("num_experts", "num_experts_per_tok", "intermediate_size"):
        if isinstance(config[key], bool) or not isinstance(config[key], int):  # the reference fails on null
            raise UnsupportedCheckpoint(f"config.json: {key} {config[key]!r} must be an integer")
    base = llama.architecture_from_config(source, config, tensors, dtype)
    if not base.qk_norm:
        raise UnsupportedCheckpoint(f"{source} checkpoint has no q/k norm tensors (self_attn.q_norm.weight), "
                                    f"which every FlexOlmo layer holds")
    experts = MixtureOfExperts(config["num_experts"], config["num_experts_per_tok"], config["intermediate_size"],
                               tuple(range(base.num_layers)), normalize=bool(config["norm_topk_prob"]))
    arch = dataclasses.replace(base, moe=experts, intermediate_size=0, sandwich_norms=True, pre_norms=False,
                               qk_norm_whole=True)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return (olmo.post_norm_attention_weights(arch, layer, take)
                + moe.sparse_weights(arch, layer, take, tensors, _NAMES) + [NamedWeight(
                    f"layers.{layer}.mlp_out_norm", take(f"model.layers.{layer}.post_feedforward_layernorm.weight"))])

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)


"""Recipe for Solar Open checkpoints (SolarOpenForCausalLM, transformers' SolarOpenConfig).

Llama's attention (`helios.ignition.recipes.llama`: q/k/v biases where ``attention_bias``, an unbiased
o_proj, whole-head rotary, full causal attention) with GLM-4.5's sparse block in every layer
(SolarOpenMoE): sigmoid scores of a float32 router (``mlp.gate.weight``) chosen with
``mlp.gate.e_score_correction_bias``, ``n_group`` / ``topk_group`` groups scored by their best two,
renormalised where ``norm_topk_prob``, scaled by ``routed_scaling_factor`` (``helios::moe_route``);
``n_routed_experts`` experts of ``moe_intermediate_size`` beside a shared gated MLP of
``moe_intermediate_size * n_shared_experts`` (0 saves zero-width tensors, which add nothing).

SolarOpenConfig drops GLM-4.5's dense layers and q/k norms: the informational keys
``first_k_dense_replace``, ``intermediate_size`` and ``use_qk_norm`` are not read (the reference reads
none of them). Keys config.json leaves out take SolarOpenConfig's defaults (rope theta 1e6). Refused by
name: another ``hidden_act``, a ``partial_rotary_factor`` (the reference's attention multiplies whole
heads by a narrower table, which fails), rope types other than Llama's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import ExpertNames, is_empty_shared_expert, mixture_from_config, sparse_weights

ARCHITECTURES = ("SolarOpenForCausalLM",)
_NAMES = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj")
# SolarOpenConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"rms_norm_eps": 1e-5, "num_key_value_heads": 8, "head_dim": 128, "moe_intermediate_size": 1280,
             "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0,
             "n_group": 1, "topk_group": 1, "norm_topk_prob": True}
_UNREAD = ("first_k_dense_replace", "intermediate_size", "use_qk_norm", "sliding_window", "use_sliding_window",
           "max_window_layers", "layer_types")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **{key: value for key, value in config.items() if key not in _UNREAD}, "intermediate_size": 0}
    if "rope_parameters" not in config and "rope_scaling" not in config:
        config.setdefault("rope_theta", 1_000_000.0)  # SolarOpenConfig.default_theta
    for key in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size"):
        if isinstance(config[key], bool) or not isinstance(config[key], int):
            raise UnsupportedCheckpoint(f"config.json: {key} {config[key]!r} must be an integer")
    base = llama.architecture_from_config(source, config, tensors, dtype)
    arch = dataclasses.replace(base, moe=mixture_from_config(source, config, base.num_layers))
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return llama.attention_weights(arch, layer, take) + sparse_weights(arch, layer, take, tensors, _NAMES)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors,
                               lambda name: is_empty_shared_expert(name, arch, tensors))

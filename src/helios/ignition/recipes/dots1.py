"""Recipe for dots.llm1 checkpoints (Dots1ForCausalLM): Qwen3's attention with DeepSeek-V3's experts.

Attention is the Llama recipe's (`helios.ignition.recipes.llama`) as Qwen3 uses it: per-head q/k
norms before the rotation, q/k/v/o biases where ``attention_bias``, whole-head rotary (Llama's rope
types; a ``partial_rotary_factor`` is refused: its reference rotates whole heads), sliding layers by
``layer_types`` or, where config.json has none, as Dots1Config derives them (sliding from
``max_window_layers`` on when ``sliding_window`` is set). The first ``first_k_dense_replace`` layers
are dense; the others route as DeepSeek-V3 does (`helios.ignition.recipes.moe`'s reading of GLM-4.5 /
DeepSeek-V3 routing: sigmoid scores with ``e_score_correction_bias``, ``n_group`` / ``topk_group``
groups scored by their best two, ``norm_topk_prob``, ``routed_scaling_factor``) beside
``n_shared_experts`` shared experts of ``moe_intermediate_size`` each (none saves zero-width tensors,
which are skipped).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import ExpertNames, is_empty_shared_expert, mixture_from_config, sparse_layer_weights

ARCHITECTURES = ("Dots1ForCausalLM",)
_NAMES = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = with_layer_types(config)
    base = llama.architecture_from_config(source, config, tensors, dtype)
    for key in ("n_routed_experts", "first_k_dense_replace"):
        if config.get(key) is None:  # the reference fails on null
            raise UnsupportedCheckpoint(f"config.json: {key} must be an integer, got null")
    dense = int(config["first_k_dense_replace"]) >= base.num_layers
    moe = None if dense else mixture_from_config(source, config, base.num_layers)
    arch = dataclasses.replace(base, moe=moe)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    weights, used = llama.prepared_weights(arch, config, tensors, sparse_layer_weights(tensors, _NAMES))
    return llama.placed_recipe(source, arch, weights, used, tensors,
                               lambda name: is_empty_shared_expert(name, arch, tensors))


def with_layer_types(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with Dots1Config's ``layer_types`` where config.json has none: sliding from
    ``max_window_layers`` on where ``sliding_window`` is set, full attention elsewhere."""
    config = dict(config)
    if config.get("layer_types") is None:
        layers, window = int(config["num_hidden_layers"]), config.get("sliding_window")
        first = config.get("max_window_layers")
        if first is None and window is not None:  # the reference compares layer indices with it, and fails
            raise UnsupportedCheckpoint("config.json: max_window_layers must be an integer beside a sliding_window")
        config["layer_types"] = ["sliding_attention" if window is not None and i >= first else "full_attention"
                                 for i in range(layers)]
    return config

"""Recipe for Ministral checkpoints (Ministral-8B): MinistralForCausalLM (transformers' MinistralConfig).

The decoder is Mistral's (Llama's grouped-query attention without biases, gated SiLU MLP, RMS norms;
rope settings as Llama's), with sliding and full layers by ``layer_types``; where config.json leaves it
out, every layer slides over ``sliding_window`` (MinistralConfig's rule; its default window is 4096).
A null ``sliding_window`` is refused: MinistralModel builds a sliding mask for every model and fails
without one. Refused by name: another ``hidden_act``, another rope type, a partial rotary
factor, malformed ``layer_types``, sliding layers without a positive ``sliding_window``, a null or
missing ``head_dim`` (MinistralConfig's default, on which the reference fails).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("MinistralForCausalLM",)
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if config.get("head_dim") is None:  # MinistralAttention sizes heads by it (its config class defaults it to null)
        raise UnsupportedCheckpoint("config.json: head_dim is null or left out, which the Ministral reference cannot "
                                    "size heads by")
    if config.get("sliding_window") is None:  # MinistralModel builds its sliding mask whatever the layer kinds
        raise UnsupportedCheckpoint("config.json: sliding_window is null, without which the Ministral reference "
                                    "cannot mask its layers")
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types") or ["sliding_attention"] * num_layers
    windows = llama.sliding_layer_windows(config, llama.listed_layer_types(kinds, num_layers))
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    arch = dataclasses.replace(llama.architecture_from_config(source, plain, tensors, dtype), layer_windows=windows)
    weights, used = llama.prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)

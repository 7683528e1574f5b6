"""Recipe for Jais 2 checkpoints (Jais2ForCausalLM, transformers' Jais2Config).

Llama's attention (q/k/v/o biases where ``attention_bias``, whole-head rotary) with LayerNorms that
have biases (``input_layernorm``, ``post_attention_layernorm``, ``model.norm``: ``layer_norm`` and
``norm_bias``, epsilon ``layer_norm_eps``) and Nemotron's non-gated MLP (``up_proj`` ->
``hidden_act``, relu^2 by default -> ``down_proj``, biases where ``mlp_bias``; ``gated_mlp`` False),
placed as `helios.ignition.recipes.nemotron` places them without Nemotron's weight + 1.

Jais2Config's defaults fill the keys config.json leaves out (relu2, epsilon 1e-5, biases on).
Refused by name: activations other than relu2, silu, gelu and gelu_pytorch_tanh, a partial rotary
factor (the reference rotates whole heads), rope types other than Llama's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama, plain_mlp, starcoder2
from helios.ignition.recipes.base import NamedWeight, Recipe
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Jais2ForCausalLM",)
_ACTIVATIONS = {"relu2": "relu2", "silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
_DEFAULTS = {"hidden_act": "relu2", "layer_norm_eps": 1e-5}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps", "hidden_act")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    activation = llama.mlp_activation(config, _ACTIVATIONS)
    eps = llama.norm_epsilon(config, "layer_norm_eps")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": eps}, tensors, dtype)
    arch = dataclasses.replace(base, layer_norm=True, norm_bias=True, gated_mlp=False, mlp_activation=activation,
                               mlp_bias=plain_mlp.BIAS in tensors)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return starcoder2.layer_norm_attention_weights(arch, layer, take) + plain_mlp.mlp_weights(
            arch, layer, take, tensors)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, *starcoder2.with_final_norm_bias(arch, weights, used, tensors), tensors)

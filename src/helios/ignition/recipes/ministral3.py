"""Recipe for Ministral 3 text checkpoints: Ministral3ForCausalLM (transformers' Ministral3Config).

The decoder is Mistral's (Llama's grouped-query attention without biases, gated SiLU MLP, RMS norms;
every layer sliding over ``sliding_window`` where it is set, as MistralModel masks) whose queries are
scaled per position after the rotation by 1 + beta * log(1 + floor(p / M)) (Llama 4's attention
scaling: ``Architecture.query_temperature`` over every layer with position offset 0), beta the rope
dict's ``llama_4_scaling_beta`` and M its ``original_max_position_embeddings``. Its rope is Llama's
(YaRN by default: Ministral3Config's theta 1e6, factor 16 over an original context of 16384, beta 0.1).

Ministral3Config's defaults fill the keys a config.json leaves out. Refused by name: another
``hidden_act``, another rope type, a partial rotary factor, a ``llama_4_scaling_beta`` or
``original_max_position_embeddings`` that is not a finite number (the reference computes with both), a
``sliding_window`` that is not a positive count or null.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from helios.ignition.architecture import QueryTemperature
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Ministral3ForCausalLM",)
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")
DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    window = config.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UnsupportedCheckpoint(f"config.json: sliding_window {window!r} must be a positive count or null")
    if not (config.get("rope_scaling") or config.get("rope_parameters")):
        config = {**config, "rope_parameters": {**DEFAULT_ROPE, "max_position_embeddings": config.get(
            "max_position_embeddings")}}
    params = llama.rope_settings(config)
    scaling = {key: params.get(key) for key in ("llama_4_scaling_beta", "original_max_position_embeddings")}
    for key, value in scaling.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UnsupportedCheckpoint(f"config.json: rope_parameters {key} must be a number, got {value!r}")
    if not scaling["original_max_position_embeddings"] > 0:
        raise UnsupportedCheckpoint("config.json: rope_parameters original_max_position_embeddings must be positive "
                                    "(it divides positions)")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, plain, tensors, dtype)
    temperature = QueryTemperature(float(scaling["original_max_position_embeddings"]),
                                   float(scaling["llama_4_scaling_beta"]), tuple(range(base.num_layers)), 0.0)
    arch = dataclasses.replace(base, layer_windows=(window or 0,) * base.num_layers, query_temperature=temperature)
    weights, used = llama.prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)

"""Recipe for Code World Model checkpoints (CwmForCausalLM, transformers' CwmConfig).

Llama's decoder (`helios.ignition.recipes.llama`, no attention biases) with sliding and full layers:
``layer_types`` or, where config.json has none, every fourth layer from the first full and the others
sliding over ``sliding_window`` (CwmConfig's default 8192), as CwmAttention (Qwen2's) attends.

CwmConfig's defaults fill the keys config.json leaves out, its rope settings included: without
``rope_parameters`` the reference rotates with llama3 scaling (theta 1e6, factor 16, frequency factors
1 and 4 over an original context of 8192) and ignores a legacy ``rope_theta``; a legacy ``rope_scaling``
without ``rope_parameters`` (which the reference reads with that default theta) is refused by name rather
than read one way or the other. Also refused by name: another ``hidden_act``, a partial rotary factor,
sliding layers without a positive ``sliding_window``.
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("CwmForCausalLM",)
# CwmConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"rms_norm_eps": 1e-5, "num_key_value_heads": 8, "head_dim": 128, "sliding_window": 8192}
_ROPE = {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0, "high_freq_factor": 4.0,
         "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    if config.get("rope_parameters") is None:
        if config.get("rope_scaling") is not None:
            raise UnsupportedCheckpoint("config.json: a legacy rope_scaling without rope_parameters (the CWM "
                                        "reference reads it over a default theta of 1e6); give rope_parameters")
        config = {**{k: v for k, v in config.items() if k != "rope_theta"}, "rope_parameters": dict(_ROPE)}
    if config.get("layer_types") is None:  # CwmConfig's: full at every i % 4 == 0, sliding elsewhere
        config["layer_types"] = ["full_attention" if i % 4 == 0 else "sliding_attention"
                                 for i in range(int(config["num_hidden_layers"]))]
    arch = llama.architecture_from_config(source, config, tensors, dtype)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    weights, used = llama.prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)

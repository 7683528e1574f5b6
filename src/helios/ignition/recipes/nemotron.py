"""Recipe for Nemotron (Nemotron-3 / Minitron) checkpoints: NemotronForCausalLM (transformers' NemotronConfig).

The decoder is Llama's grouped-query attention with these differences, each an `Architecture` switch:

- every norm is ``NemotronLayerNorm1P``: a LayerNorm with a bias whose weight is applied as
  ``weight + 1`` (``layer_norm``, ``norm_bias``; the 1 is added to the prepared norm weights, in the
  prepared dtype as the reference adds it to its parameter); epsilon ``norm_eps``;
- a non-gated MLP (``gated_mlp`` False: ``up_proj`` -> relu^2 -> ``down_proj``, biases with
  ``mlp_bias``; `helios.ignition.recipes.plain_mlp`); ``hidden_act`` relu2 (the default), ``silu``,
  ``gelu`` and ``gelu_pytorch_tanh`` are taken;
- partial rotary: the leading ``head_dim * partial_rotary_factor`` dimensions of each head rotate in
  halves (0.5 by default), as Phi's (`helios.ignition.recipes.moe.partial_rotary`);
- ``attention_bias`` puts a bias on q, k, v and o.

NemotronConfig's defaults fill the keys a config.json leaves out (``norm_eps`` 1e-5, relu2,
``partial_rotary_factor`` 0.5). The reference masks causally over the whole context. Refused by name:
another ``hidden_act``, rope types other than Llama's (default, linear, llama3, yarn), a partial rotary
factor that leaves no even rotated width, a ``norm_eps`` that is not a finite number, a null or
missing ``num_key_value_heads`` (NemotronConfig has no fallback for it: the reference fails).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama, plain_mlp, starcoder2
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import partial_rotary

ARCHITECTURES = ("NemotronForCausalLM",)
_ACTIVATIONS = {"relu2": "relu2", "silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps", "hidden_act")
_ONE_PLUS = ("input_layernorm.weight", "post_attention_layernorm.weight")  # and model.norm.weight


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if config.get("num_key_value_heads") is None:  # NemotronAttention divides by it as it stands
        raise UnsupportedCheckpoint("config.json: num_key_value_heads is null or left out, which the Nemotron "
                                    "reference cannot group heads by")
    activation = llama.mlp_activation(config, _ACTIVATIONS)
    eps = llama.norm_epsilon(config, "norm_eps")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": eps}, tensors, dtype)
    arch = dataclasses.replace(base, layer_norm=True, norm_bias=True, gated_mlp=False, mlp_activation=activation,
                               mlp_bias=plain_mlp.BIAS in tensors)
    inv_freq, spread = partial_rotary(config, arch.head_dim, llama.rotary_width(config, arch.head_dim))

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith(_ONE_PLUS) or name == "model.norm.weight":
            return tensor + 1.0
        return spread(name, tensor)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return starcoder2.layer_norm_attention_weights(arch, layer, take) + plain_mlp.mlp_weights(
            arch, layer, take, tensors)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq, transform)
    return llama.placed_recipe(source, arch, *starcoder2.with_final_norm_bias(arch, weights, used, tensors), tensors)

"""Recipe for StarCoder2 checkpoints: Starcoder2ForCausalLM (transformers' Starcoder2Config).

The decoder is Llama's grouped-query attention with these differences, each an `Architecture` switch:

- every norm is ``nn.LayerNorm`` with a bias (``layer_norm``, ``norm_bias``: ``input_layernorm`` and
  ``post_attention_layernorm`` before the attention and the MLP, ``model.norm`` the final one; epsilon
  ``norm_epsilon``); the biases are the ``<norm>_bias`` slots;
- a non-gated MLP (``gated_mlp`` False): ``c_fc`` -> ``hidden_act`` -> ``c_proj``, the prepared
  ``up`` and ``down`` projections (``gelu_pytorch_tanh``, the default, is ``mlp_activation`` "gelu_tanh";
  ``silu`` is taken too);
- ``use_bias`` (true by default) puts a bias on q, k, v, o, ``c_fc`` and ``c_proj`` (taken from what the
  checkpoint holds);
- ``sliding_window`` (null by default: full attention) slides every layer (a query sees its last
  ``sliding_window`` positions, its own included, as the reference's sliding mask does).

The dropouts are training-only. Starcoder2Config's defaults fill the keys a config.json leaves out
(`helios.ignition.recipes.defaults`: ``norm_epsilon`` 1e-5, tied embeddings, ``gelu_pytorch_tanh``,
theta 10000). Refused by name: another ``hidden_act``, rope types other than Llama's (default, linear,
llama3, yarn), a partial rotary factor, a ``norm_epsilon`` that is not a finite number, a
``sliding_window`` that is not a positive count (or null).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Starcoder2ForCausalLM",)
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}  # hidden_act -> Architecture.mlp_activation
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps", "hidden_act")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    activation = llama.mlp_activation(config, _ACTIVATIONS)
    eps = llama.norm_epsilon(config, "norm_epsilon")
    window = config.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UnsupportedCheckpoint(f"config.json: sliding_window {window!r} must be a positive count or null")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": eps}, tensors, dtype)
    arch = dataclasses.replace(
        base, layer_windows=(window or 0,) * base.num_layers, layer_norm=True, norm_bias=True, gated_mlp=False,
        mlp_activation=activation, mlp_bias="model.layers.0.mlp.c_fc.bias" in tensors)
    weights, used = llama.prepared_weights(arch, config, tensors, _layer_weights)
    return llama.placed_recipe(source, arch, *with_final_norm_bias(arch, weights, used, tensors), tensors)


def with_final_norm_bias(arch: Architecture, weights: tuple[NamedWeight, ...], used: set[str],
                         tensors: CheckpointTensors) -> tuple[tuple[NamedWeight, ...], set[str]]:
    """`llama.prepared_weights`' (weights, used) with ``final_norm_bias`` (``model.norm.bias``) right
    after ``final_norm``."""
    final = next(index for index, weight in enumerate(weights) if weight.name == "final_norm") + 1
    used.add("model.norm.bias")
    bias = NamedWeight("final_norm_bias", tensors.get("model.norm.bias").to(arch.torch_dtype))
    return weights[:final] + (bias,) + weights[final:], used


def layer_norm_attention_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A LayerNorm layer's slots from ``input_norm`` through ``post_norm_bias`` (Llama's names, each
    norm with its bias; a parallel block ends with ``o``)."""
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    out = llama.attention_block_weights(arch, layer, take)
    out.insert(1, NamedWeight(dst + "input_norm_bias", take(src + "input_layernorm.bias")))
    if arch.parallel_block:
        return out
    return out + [NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")),
                  NamedWeight(dst + "post_norm_bias", take(src + "post_attention_layernorm.bias"))]


def _layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    dst, mlp = f"layers.{layer}.", f"model.layers.{layer}.mlp."
    out = layer_norm_attention_weights(arch, layer, take)
    out += [NamedWeight(dst + "up.weight", take(mlp + "c_fc.weight"))]
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "up.bias", take(mlp + "c_fc.bias")))
    out.append(NamedWeight(dst + "down.weight", take(mlp + "c_proj.weight")))
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "down.bias", take(mlp + "c_proj.bias")))
    return out

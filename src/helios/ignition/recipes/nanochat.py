"""Recipe for nanochat checkpoints (NanoChatForCausalLM, transformers' NanoChatConfig).

A Llama-shaped decoder whose every norm is an RMS norm without parameters (the embeddings', each
layer's two, the q/k norms and the final one: prepared as weights of ones), as NanoChatModel computes it:

- the embeddings are normed before the first layer (`Architecture.embedding_norm`, slot ``embed_norm``);
- the rotation turns the other way (NanoChat's rotate_half is (x2, -x1)): rotating by -theta, so the
  prepared frequencies are negated (cos is even, sin odd: the same tables, sin negated);
- per-head q/k norms after the rotation (``qk_norm_after_rotary``);
- the non-gated MLP ``fc1`` -> ``hidden_act`` (relu^2 by default) -> ``fc2`` (``gated_mlp`` False);
- the final logits soft-capped at ``final_logit_softcapping`` (``logit_softcap``; null: none).

NanoChatConfig's defaults fill the keys config.json leaves out (relu2, epsilon 1e-6, cap 15). Refused by
name: activations other than relu2, silu, gelu and gelu_pytorch_tanh, a partial rotary factor (the
reference rotates whole heads), rope types other than Llama's, a soft cap that is not a positive number.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.olmo1 import UnitNorms
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("NanoChatForCausalLM",)
_ACTIVATIONS = {"relu2": "relu2", "silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
_DEFAULTS = {"hidden_act": "relu2", "rms_norm_eps": 1e-6, "final_logit_softcapping": 15.0}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "hidden_act", "head_dim")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    activation = llama.mlp_activation(config, _ACTIVATIONS)
    cap = config["final_logit_softcapping"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap)
                            or cap <= 0):
        raise UnsupportedCheckpoint(f"config.json: final_logit_softcapping {cap!r} must be a positive number or null")
    # NanoChatAttention sizes heads by hidden_size / num_attention_heads whatever head_dim says.
    base = llama.architecture_from_config(
        source, {key: value for key, value in config.items() if key not in _UNREAD}, tensors, dtype)
    arch = dataclasses.replace(base, embedding_norm=True, qk_norm=True, qk_norm_after_rotary=True, gated_mlp=False,
                               mlp_activation=activation, logit_softcap=float(cap or 0.0))
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        attn = src + "self_attn."
        unit, heads = torch.ones(arch.hidden_size, dtype=arch.torch_dtype), torch.ones(arch.head_dim,
                                                                                        dtype=arch.torch_dtype)
        out = [NamedWeight(dst + "input_norm", unit),
               NamedWeight(dst + "qkv.weight", fused(take, [attn + f"{p}_proj.weight" for p in "qkv"]))]
        if arch.qkv_bias:
            out.append(NamedWeight(dst + "qkv.bias", fused(take, [attn + f"{p}_proj.bias" for p in "qkv"])))
        out += [NamedWeight(dst + "q_norm", heads), NamedWeight(dst + "k_norm", heads),
                NamedWeight(dst + "o.weight", take(attn + "o_proj.weight"))]
        if arch.o_bias:
            out.append(NamedWeight(dst + "o.bias", take(attn + "o_proj.bias")))
        return out + [NamedWeight(dst + "post_norm", unit), NamedWeight(dst + "up.weight", take(src + "mlp.fc1.weight")),
                      NamedWeight(dst + "down.weight", take(src + "mlp.fc2.weight"))]

    weights, used = llama.prepared_weights(arch, config, UnitNorms(tensors, arch.hidden_size), layer_weights,
                                           inv_freq=-llama.rope_inv_freq(config, arch.head_dim))
    unit = torch.ones(arch.hidden_size, dtype=arch.torch_dtype)
    weights = weights[:1] + (NamedWeight("embed_norm", unit),) + weights[1:]
    return llama.placed_recipe(source, arch, weights, used, tensors)

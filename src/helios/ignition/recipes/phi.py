"""Recipe for Phi-1 / Phi-1.5 / Phi-2 checkpoints: PhiForCausalLM (transformers' PhiConfig).

The decoder differs from Llama's in its norms, block and MLP, each an `Architecture` switch:

- every norm is ``nn.LayerNorm`` with a bias (``layer_norm``, ``norm_bias``): the layers'
  ``input_layernorm`` and the final ``model.final_layernorm``; epsilon ``layer_norm_eps``;
- the parallel block (``parallel_block``): a layer's attention and MLP both read its
  ``input_layernorm`` output and their sum is added to the residual stream;
- a non-gated MLP (``gated_mlp`` False): ``fc1`` -> ``hidden_act`` -> ``fc2`` with biases
  (``gelu_new``, the default, and ``gelu_pytorch_tanh`` are the tanh-approximated GELU, ``mlp_activation``
  "gelu_tanh": the same formula, rounded apart in the last bits; ``silu`` is taken too);
- q/k/v and ``dense`` (the o projection) biases, and a bias on ``lm_head`` (``head_bias``);
- partial rotary: the leading ``head_dim * partial_rotary_factor`` dimensions of each head rotate
  in halves (0.5 by default), the rest pass through: the q/k rows are spread by
  `helios.ignition.recipes.moe.partial_rotary` (zero frequencies past the rotated width).

PhiConfig's defaults fill the keys a config.json leaves out (`helios.ignition.recipes.defaults`:
``partial_rotary_factor`` 0.5, ``layer_norm_eps`` 1e-5, ``gelu_new``, untied). The reference masks
causally over the whole context. The dropouts are training-only. Refused by name: ``qk_layernorm``
(per-head q/k LayerNorms with biases), another ``hidden_act``, rope types other than Llama's
(default, linear, llama3, yarn), a partial rotary factor that leaves no even rotated width, a
``layer_norm_eps`` that is not a finite number.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import partial_rotary

ARCHITECTURES = ("PhiForCausalLM",)
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps", "hidden_act")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if config.get("qk_layernorm"):
        raise UnsupportedCheckpoint("config.json: qk_layernorm (per-head q/k LayerNorms with biases) is not supported")
    activation = llama.mlp_activation(config, _ACTIVATIONS)
    eps = llama.norm_epsilon(config, "layer_norm_eps")
    if "head_dim" in config and config["head_dim"] is None:  # PhiAttention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Phi reference cannot size heads by")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": eps}, tensors, dtype)
    arch = dataclasses.replace(
        base, layer_norm=True, norm_bias=True, parallel_block=True, gated_mlp=False, head_bias=True,
        mlp_activation=activation, qkv_bias=True, o_bias=True, mlp_bias=True)
    rotary = llama.rotary_width(config, arch.head_dim)
    inv_freq, spread = partial_rotary(config, arch.head_dim, rotary)
    used: set[str] = set()

    def take(name: str):
        used.add(name)
        return spread(name, tensors.get(name).to(arch.torch_dtype))

    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        weights += _layer_weights(layer, take)
    weights += [NamedWeight("final_norm", take("model.final_layernorm.weight")),
                NamedWeight("final_norm_bias", take("model.final_layernorm.bias"))]
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights += [NamedWeight("lm_head_bias", take("lm_head.bias")), NamedWeight("rope.inv_freq", inv_freq)]
    return llama.placed_recipe(source, arch, tuple(weights), used, tensors)


def _layer_weights(layer: int, take) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    attn, mlp = src + "self_attn.", src + "mlp."
    qkv = [attn + "q_proj.", attn + "k_proj.", attn + "v_proj."]
    return [NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")),
            NamedWeight(dst + "input_norm_bias", take(src + "input_layernorm.bias")),
            NamedWeight(dst + "qkv.weight", fused(take, [p + "weight" for p in qkv])),
            NamedWeight(dst + "qkv.bias", fused(take, [p + "bias" for p in qkv])),
            NamedWeight(dst + "o.weight", take(attn + "dense.weight")),
            NamedWeight(dst + "o.bias", take(attn + "dense.bias")),
            NamedWeight(dst + "up.weight", take(mlp + "fc1.weight")),
            NamedWeight(dst + "up.bias", take(mlp + "fc1.bias")),
            NamedWeight(dst + "down.weight", take(mlp + "fc2.weight")),
            NamedWeight(dst + "down.bias", take(mlp + "fc2.bias"))]


"""Recipe for AFMoE checkpoints (AfmoeForCausalLM: Arcee's Trinity models, transformers' AfmoeConfig).

Llama's grouped-query attention with, as AfmoeAttention and AfmoeDecoderLayer compute them:

- per-head q/k RMS norms before the rotation; only the sliding layers rotate, the full layers attend
  without positions (``nope_layers``); layer kinds by ``layer_types`` or, where config.json has none,
  every ``global_attn_every_n_layers``-th layer full, the others sliding over ``sliding_window``;
- the attention output gated per channel by sigmoid(``self_attn.gate_proj`` x) before ``o_proj``
  (`Architecture.attention_gate`: the gate rows follow q, k and v in the fused projection; with
  ``attention_bias`` their bias is zero, as gate_proj has none);
- four norms per layer: before and after the attention, before and after the MLP
  (``sandwich_norms`` beside the pre-norms: ``input_layernorm``, ``post_attention_layernorm`` ->
  ``attn_out_norm``, ``pre_mlp_layernorm`` -> ``post_norm``, ``post_mlp_layernorm`` -> ``mlp_out_norm``);
- the first ``num_dense_layers`` MLPs dense, the others a mixture: sigmoid scores of
  ``mlp.router.gate.weight``, the top ``num_experts_per_tok`` chosen by score plus ``mlp.expert_bias``,
  weighted by their scores renormalised (always) and scaled by ``route_scale``, beside a shared MLP of
  ``moe_intermediate_size * num_shared_experts`` (``helios::moe_route`` with one group);
- with ``mup_enabled`` the embeddings multiplied by sqrt(hidden_size) (``embedding_scale``).

AfmoeConfig's defaults fill the keys config.json leaves out. Refused by name: another ``hidden_act``,
layer kinds its config class cannot derive (a ``global_attn_every_n_layers`` that is not a positive
integer), sliding layers without a positive ``sliding_window``, a partial rotary factor, rope types other
than Llama's, and a checkpoint without sparse layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import ExpertNames, is_empty_shared_expert, sparse_weights

ARCHITECTURES = ("AfmoeForCausalLM",)
_NAMES = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj", router="router.gate.weight",
                     correction_bias="expert_bias")
# AfmoeConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"rms_norm_eps": 1e-5, "head_dim": 128, "num_dense_layers": 1, "moe_intermediate_size": 1408,
             "num_experts": 64, "num_experts_per_tok": 6, "num_shared_experts": 2, "route_scale": 1.0,
             "global_attn_every_n_layers": 4, "sliding_window": 1024, "mup_enabled": False}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    base = llama.architecture_from_config(
        source, {key: value for key, value in config.items() if key not in _UNREAD}, tensors, dtype)
    if not base.qk_norm:
        raise UnsupportedCheckpoint(f"{source} checkpoint has no q/k norm tensors (self_attn.q_norm.weight), "
                                    f"which every AFMoE layer holds")
    kinds = layer_types(config, base.num_layers)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    arch = dataclasses.replace(
        base, moe=mixture(config, base.num_layers), layer_windows=llama.sliding_layer_windows(config, kinds),
        nope_layers=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention"), attention_gate=True,
        sandwich_norms=True, embedding_scale=float(base.hidden_size) ** 0.5 if config["mup_enabled"] else 1.0)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        mlp = (sparse_weights(arch, layer, take, tensors, _NAMES) if arch.is_sparse(layer)
               else llama.dense_mlp_weights(arch, layer, take))
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        return (gated_attention_weights(arch, layer, take)
                + [NamedWeight(dst + "attn_out_norm", take(src + "post_attention_layernorm.weight")),
                   NamedWeight(dst + "post_norm", take(src + "pre_mlp_layernorm.weight"))]
                + mlp + [NamedWeight(dst + "mlp_out_norm", take(src + "post_mlp_layernorm.weight"))])

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors,
                               lambda name: is_empty_shared_expert(name, arch, tensors))


def gated_attention_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """Llama's ``input_norm`` ... ``o`` slots with ``gate_proj``'s rows after q, k and v (a zero bias where
    q/k/v have biases)."""
    gate = take(f"model.layers.{layer}.self_attn.gate_proj.weight")
    slots = []
    for slot in llama.attention_block_weights(arch, layer, take):
        name = slot.name.rsplit(".", 2)[-2:]
        if name == ["qkv", "weight"]:
            slot = NamedWeight(slot.name, torch.cat([slot.tensor, gate]))
        elif name == ["qkv", "bias"]:
            slot = NamedWeight(slot.name, torch.cat([slot.tensor, slot.tensor.new_zeros(gate.shape[0])]))
        slots.append(slot)
    return slots


def layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind as AfmoeConfig resolves it: ``layer_types``, else full for every
    ``global_attn_every_n_layers``-th layer and sliding for the others."""
    kinds = config.get("layer_types")
    if kinds is not None:
        return llama.listed_layer_types(kinds, num_layers)
    every = config["global_attn_every_n_layers"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UnsupportedCheckpoint(f"config.json: global_attn_every_n_layers {every!r} gives no layer kinds without "
                                    f"layer_types (the reference's config class fails on it)")
    return tuple("sliding_attention" if (i + 1) % every else "full_attention" for i in range(num_layers))


def mixture(config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts:
    """The sparse layers (from ``num_dense_layers`` on) and their routing."""
    for key in ("num_dense_layers", "num_experts", "num_experts_per_tok", "num_shared_experts",
                "moe_intermediate_size"):
        if isinstance(config[key], bool) or not isinstance(config[key], int):  # the reference fails on null
            raise UnsupportedCheckpoint(f"config.json: {key} {config[key]!r} must be an integer")
    sparse = tuple(range(max(config["num_dense_layers"], 0), num_layers))
    if not sparse:
        raise UnsupportedCheckpoint(f"num_dense_layers {config['num_dense_layers']} leaves no sparse layer of "
                                    f"{num_layers}: not an AFMoE checkpoint this recipe supports")
    scale = config["route_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):  # the reference multiplies by it
        raise UnsupportedCheckpoint(f"config.json: route_scale {scale!r} must be a number")
    width = config["moe_intermediate_size"]
    return MixtureOfExperts(config["num_experts"], config["num_experts_per_tok"], width, sparse, scoring="sigmoid",
                            normalize=True, scale=float(scale), correction_bias=True,
                            shared_intermediate_size=width * config["num_shared_experts"])

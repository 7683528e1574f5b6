"""Recipe for Granite 4.0 hybrid checkpoints (GraniteMoeHybridForCausalLM).

Bamba's decoder (`helios.ignition.recipes.bamba`: Mamba2 mixers and grouped-query attention layers,
each layer a pre-norm, its mixer or attention, a post-norm and an MLP) with Granite's dataflow:

- ``layer_types`` (or ``layers_block_type``) names each layer "mamba" / "linear_attention" (a
  Mamba2 mixer, ``mamba.*`` tensors) or "attention" / "full_attention"; at least one of each
  unless every layer attends, which prepares a plain decoder (Granite 4.0 Micro);
- the MLP: with ``num_local_experts`` > 0 Granite MoE's experts (``block_sparse_moe``, top-k
  softmax routing, `helios.ignition.recipes.granite_moe`) plus ``shared_mlp`` as their shared
  expert (none where ``shared_intermediate_size`` is 0: transformers saves it zero-wide); with 0
  experts ``shared_mlp`` alone is the layer's dense gated MLP (``shared_intermediate_size`` wide;
  ``input_linear`` holds the gate rows, then the up rows);
- Granite's four multipliers (`helios.ignition.recipes.granite`): the residual multiplier folded
  into the o projection, the mixer's out projection, the experts' and the shared MLP's output
  projections; the logits divisor into the final norm; the embedding multiplier and the attention
  scale as Architecture fields;
- ``position_embedding_type`` "rope" rotates whole heads by the default rope; null or "nope"
  attends without positions, prepared as all-zero rotary frequencies (cos 1, sin 0: the rotation
  is the identity). Other rope types, a partial rotary factor and other position types are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import bamba, granite, granite_moe, llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("GraniteMoeHybridForCausalLM",)
MIXER_KINDS = ("mamba", "linear_attention")
ATTENTION_KINDS = ("attention", "full_attention")
_NO_POSITIONS = (None, "nope")
_RESIDUAL_OUTPUTS = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mamba.out_proj.weight",
                     "mamba.out_proj.bias", "block_sparse_moe.output_linear.weight",
                     "block_sparse_moe.experts.down_proj", "shared_mlp.output_linear.weight")
_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if "head_dim" in config and config["head_dim"] is None:  # the attention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Granite reference cannot size heads by")
    multipliers = granite.read_multipliers(config)
    arch = architecture_from_config(source, config, tensors, dtype)
    arch = dataclasses.replace(arch, embedding_scale=multipliers["embedding_multiplier"],
                               query_pre_attn_scalar=multipliers["attention_multiplier"] ** -2)
    mixer_used: set[str] = set()

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return _layer_weights(arch, layer, take, tensors, mixer_used)

    inv_freq = None if is_rotary(config) else torch.zeros(arch.head_dim // 2)
    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq=inv_freq,
                                           transform=granite.folded_multipliers(multipliers, _RESIDUAL_OUTPUTS))
    recipe = llama.placed_recipe(source, arch, weights, used | mixer_used | _empty_shared_mlp(arch, tensors), tensors)
    return dataclasses.replace(recipe, inputs_embeds_scale=multipliers["embedding_multiplier"])


def _empty_shared_mlp(arch: Architecture, tensors: CheckpointTensors) -> set[str]:
    """The zero-width ``shared_mlp`` tensors transformers saves beside experts for
    ``shared_intermediate_size`` 0 (its output is zeros: nothing to place)."""
    if arch.moe is None or arch.moe.shared_intermediate_size:
        return set()
    return {name for name in tensors.names if ".shared_mlp." in name and tensors.get(name).numel() == 0}


def layer_kinds(config: Mapping[str, Any]) -> tuple[bool, ...]:
    """Per layer: True for a Mamba2 mixer, False for attention (module docstring)."""
    kinds = config.get("layer_types", config.get("layers_block_type"))
    layers = int(config["num_hidden_layers"])
    if kinds is None:  # the config class's default: every layer a mixer (refused below)
        kinds = ["mamba"] * layers
    if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {*MIXER_KINDS, *ATTENTION_KINDS}:
        raise UnsupportedCheckpoint(f"config.json: layer_types {kinds!r:.120} must name one of "
                                    f"{MIXER_KINDS + ATTENTION_KINDS} for each of the {layers} layers")
    mixers = tuple(kind in MIXER_KINDS for kind in kinds)
    if all(mixers):
        raise UnsupportedCheckpoint("config.json: layer_types has no attention layer (a decoder of Mamba2 mixers "
                                    "alone is not supported)")
    return mixers


def is_rotary(config: Mapping[str, Any]) -> bool:
    """Whether the attention layers rotate (``position_embedding_type`` "rope") or attend without
    positions (null or "nope"); another value is refused naming it."""
    kind = config.get("position_embedding_type")
    if kind != "rope" and kind not in _NO_POSITIONS:
        raise UnsupportedCheckpoint(f"config.json: position_embedding_type {kind!r} is not supported (only 'rope', "
                                    f"'nope' or null)")
    return kind == "rope"


def architecture_from_config(source: str, config: Mapping[str, Any], tensors: CheckpointTensors,
                             dtype: str | None) -> Architecture:
    """Bamba's Architecture of the translated settings (layer kinds, MLP width, rope), or Llama's
    where every layer attends; the experts added."""
    mixers = layer_kinds(config)
    if is_rotary(config):
        rope = llama.rope_parameters(config)  # refuses a partial rotary factor: the reference rotates whole heads
        if rope["rope_type"] != "default":
            raise UnsupportedCheckpoint(f"rope_type {rope['rope_type']!r} is not supported (only 'default')")
        unread = {}
    else:  # the reference builds no rotary embedding: its rope settings are not read
        unread = {"rope_parameters": _DEFAULT_ROPE, "rope_scaling": None}
    experts, shared = int(config["num_local_experts"] or 0), int(config["shared_intermediate_size"] or 0)
    if not experts and not shared:
        raise UnsupportedCheckpoint("config.json: num_local_experts 0 and shared_intermediate_size 0 leave the "
                                    "layers no MLP")
    translated = {**{k: v for k, v in config.items() if k not in ("layer_types", "layers_block_type")}, **unread,
                  "partial_rotary_factor": 1.0, "mlp_bias": False, "intermediate_size": 0 if experts else shared,
                  "attn_layer_indices": [i for i, mixer in enumerate(mixers) if not mixer]}
    if any(mixers):
        arch = bamba.architecture_from_config(translated, tensors, dtype)
    else:
        arch = llama.architecture_from_config(source, translated, tensors, dtype)
    if not experts:
        return arch
    moe = MixtureOfExperts(experts, int(config["num_experts_per_tok"]), int(config["intermediate_size"]),
                           tuple(range(arch.num_layers)), scoring="topk_softmax", shared_intermediate_size=shared)
    return dataclasses.replace(arch, moe=moe)


def _layer_weights(arch: Architecture, layer: int, take, tensors: CheckpointTensors, used: set) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    if layer in arch.attention_layers:
        out = llama.attention_weights(arch, layer, take)
    else:
        out = [NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")),
               *bamba.mixer_weights(arch, src + "mamba.", dst + "mixer.", take, tensors, used),
               NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight"))]
    if arch.is_sparse(layer):
        return out + granite_moe.sparse_weights(arch, layer, take, tensors)
    return out + [NamedWeight(dst + "gate_up.weight", take(src + "shared_mlp.input_linear.weight")),
                  NamedWeight(dst + "down.weight", take(src + "shared_mlp.output_linear.weight"))]

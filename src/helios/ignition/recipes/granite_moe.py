"""Recipe for Granite mixture-of-experts checkpoints (GraniteMoeForCausalLM: Granite 3.0 / 3.1 MoE;
GraniteMoeSharedForCausalLM: with a shared expert).

Granite's decoder (`helios.ignition.recipes.granite`: its four multipliers read and folded as there;
full causal attention, the reference reads no window) with a mixture of experts in every layer:

- the router ``block_sparse_moe.router.layer.weight`` [E, H] (float32 logits) takes the top
  ``num_experts_per_tok`` logits and weights them by their softmax (``"topk_softmax"`` scoring);
- the experts are stored fused: ``block_sparse_moe.input_linear.weight`` [E, 2F, H] (per expert the
  gate rows, then the up rows: the stacked layout as it is) and ``output_linear.weight`` [E, H, F],
  F = ``intermediate_size``; transformers' in-memory names (``router.weight``,
  ``experts.gate_up_proj`` / ``experts.down_proj``) are read too;
- GraniteMoeShared adds ``shared_mlp.input_linear.weight`` [2S, H] (gate, then up) and
  ``output_linear.weight`` [H, S], S = ``shared_intermediate_size`` (0: none), added to the experts.

``residual_multiplier`` scales the whole block output, so it is folded into the o projection, every
expert's down projection and the shared expert's (the routing weights do not depend on them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import granite, llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")
_RESIDUAL_OUTPUTS = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "block_sparse_moe.output_linear.weight",
                     "block_sparse_moe.experts.down_proj", "shared_mlp.output_linear.weight")
# (checkpoint name, transformers' in-memory name) of each sparse-block tensor, under the layer prefix
_ROUTER = ("block_sparse_moe.router.layer.weight", "block_sparse_moe.router.weight")
_GATE_UP = ("block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj")
_DOWN = ("block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if "head_dim" in config and config["head_dim"] is None:  # GraniteMoeAttention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Granite reference cannot size heads by")
    multipliers = granite.read_multipliers(config)
    base = llama.architecture_from_config(source, config, tensors, dtype)
    shared = int(config.get("shared_intermediate_size") or 0) if source == "GraniteMoeSharedForCausalLM" else 0
    experts = MixtureOfExperts(int(config["num_local_experts"]), int(config["num_experts_per_tok"]),
                               int(config["intermediate_size"]), tuple(range(base.num_layers)),
                               scoring="topk_softmax", shared_intermediate_size=shared)
    arch = dataclasses.replace(base, moe=experts, intermediate_size=0,
                               embedding_scale=multipliers["embedding_multiplier"],
                               query_pre_attn_scalar=multipliers["attention_multiplier"] ** -2)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    folded = granite.folded_multipliers(multipliers, _RESIDUAL_OUTPUTS)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return llama.attention_weights(arch, layer, take) + sparse_weights(arch, layer, take, tensors)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, transform=folded)
    recipe = llama.placed_recipe(source, arch, weights, used, tensors)
    return dataclasses.replace(recipe, inputs_embeds_scale=multipliers["embedding_multiplier"])


def sparse_weights(arch: Architecture, layer: int, take, tensors: CheckpointTensors) -> list[NamedWeight]:
    """A layer's router, stacked experts and shared expert, in `weight_layout` order."""
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."

    def spelled(names: tuple[str, str]) -> str:
        return src + next((name for name in names if src + name in tensors), names[0])

    out = [NamedWeight(dst + "router.weight", take(spelled(_ROUTER)).float()),
           NamedWeight(dst + "experts.gate_up", take(spelled(_GATE_UP)).contiguous()),
           NamedWeight(dst + "experts.down", take(spelled(_DOWN)).contiguous())]
    if arch.moe.shared_intermediate_size:
        out += [NamedWeight(dst + "shared.gate_up.weight", take(src + "shared_mlp.input_linear.weight")),
                NamedWeight(dst + "shared.down.weight", take(src + "shared_mlp.output_linear.weight"))]
    return out

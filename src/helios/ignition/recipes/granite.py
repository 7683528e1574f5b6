"""Recipe for Granite checkpoints (GraniteForCausalLM: Granite 3.x dense).

The decoder is Llama's (the llama recipe prepares its weights, biases and rope settings; full
causal attention), with four multipliers, read as GraniteModel applies them:

- ``embedding_multiplier`` scales the looked-up embeddings: `Architecture.embedding_scale`. The
  reference multiplies its whole ``inputs_embeds``, so rows added to the embeddings (an Engram
  table's) take it too: `Recipe.inputs_embeds_scale`;
- ``attention_multiplier`` is the attention softmax scale itself (not head_dim ** -0.5): the
  Architecture's ``query_pre_attn_scalar`` is its inverse square, whose inverse square root the
  programs take as the scale;
- ``residual_multiplier`` scales each attention and MLP output before its residual add: folded into
  the o and down projections (weights and biases), so the programs add their output as it is;
- ``logits_scaling`` divides the logits: folded into the final norm's weight (the head is linear in
  it), which also holds for tied embeddings, whose matrix the input lookup shares.

A multiplier that is not a finite number, not positive where the programs need it so (the
embedding and attention multipliers) or a logits divisor of 0 is refused naming it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import torch

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("GraniteForCausalLM",)
_RESIDUAL_OUTPUTS = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias")
_POSITIVE = ("embedding_multiplier", "attention_multiplier")
_SMALLEST_SCALE = 1e-150  # query_pre_attn_scalar = attention_multiplier ** -2 stays a finite float


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if "head_dim" in config and config["head_dim"] is None:  # GraniteAttention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Granite reference cannot size heads by")
    multipliers = read_multipliers(config)
    arch = llama.architecture_from_config(source, config, tensors, dtype)
    arch = dataclasses.replace(arch, embedding_scale=multipliers["embedding_multiplier"],
                               query_pre_attn_scalar=multipliers["attention_multiplier"] ** -2)
    folded = folded_multipliers(multipliers, _RESIDUAL_OUTPUTS)
    weights, used = llama.prepared_weights(arch, config, tensors, transform=folded)
    recipe = llama.placed_recipe(source, arch, weights, used, tensors)
    return dataclasses.replace(recipe, inputs_embeds_scale=multipliers["embedding_multiplier"])


def folded_multipliers(multipliers: Mapping[str, float],
                       residual_outputs: tuple[str, ...]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The weight transform folding ``residual_multiplier`` into the checkpoint tensors whose names end
    in one of `residual_outputs` (each block's output projections) and ``logits_scaling`` into the
    final norm (module docstring); a multiplier of 1.0 leaves its tensors as they are."""
    residual, logits = multipliers["residual_multiplier"], multipliers["logits_scaling"]

    def folded(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith(residual_outputs) and residual != 1.0:
            return tensor * residual
        if name == "model.norm.weight" and logits != 1.0:
            return tensor / logits
        return tensor

    return folded


def read_multipliers(config: Mapping[str, Any]) -> dict[str, float]:
    """The four multipliers as GraniteModel reads them (1.0 where missing), each checked (the module
    docstring says which values are refused)."""
    values = {}
    for key in (*_POSITIVE, "residual_multiplier", "logits_scaling"):
        value = config.get(key, 1.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise UnsupportedCheckpoint(f"config.json: {key} must be a finite number, got {value!r}")
        if key in _POSITIVE and value <= 0:
            raise UnsupportedCheckpoint(f"config.json: {key} {value} is not supported (only positive values)")
        if key == "logits_scaling" and value == 0:
            raise UnsupportedCheckpoint("config.json: logits_scaling 0 divides every logit by zero")
        if key == "attention_multiplier" and not value > _SMALLEST_SCALE:  # its inverse square overflows
            raise UnsupportedCheckpoint(f"config.json: attention_multiplier {value} is too small a scale")
        values[key] = float(value)
    return values

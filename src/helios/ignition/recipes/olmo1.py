"""Recipe for OLMo (v1) checkpoints: OlmoForCausalLM (transformers' OlmoConfig; OLMo-1B / 7B, OLMo-1.7).

The decoder is Llama's (grouped-query attention, gated SiLU MLP, rope settings: default, linear, llama3,
yarn; q/k/v/o biases with ``attention_bias``) with two differences, each an `Architecture` switch:

- every norm is OlmoLayerNorm, a LayerNorm without weight or bias of epsilon 1e-5 whatever config.json
  says (``layer_norm``): the checkpoint holds no norm tensors, and the prepared norm weights are ones
  (the op's arithmetic times 1 is the reference's);
- ``clip_qkv``: q, k and v clamped to [-clip_qkv, clip_qkv] right after their projections
  (``qkv_clip``, DBRX's switch); null: no clamp.

OlmoConfig's defaults fill the keys a config.json leaves out. The reference masks causally over the
whole context. Refused by name: another ``hidden_act``, another rope type, a partial rotary factor, a
``clip_qkv`` that is not a positive number or null.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("OlmoForCausalLM",)
EPS = 1e-5  # OlmoLayerNorm's, fixed
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    clip = config.get("clip_qkv")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip)
                             or clip <= 0):
        raise UnsupportedCheckpoint(f"config.json: clip_qkv must be a positive number or null, got {clip!r}")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": EPS}, tensors, dtype)
    arch = dataclasses.replace(base, layer_norm=True, qkv_clip=float(clip or 0.0))
    weights, used = llama.prepared_weights(arch, config, UnitNorms(tensors, arch.hidden_size))
    return llama.placed_recipe(source, arch, weights, used, tensors)


class UnitNorms:
    """`tensors` for `llama.prepared_weights`, with a weight of ones [hidden] for each norm the
    reference holds no parameter for (the layers' ``*_layernorm.weight`` and ``model.norm.weight``)."""

    def __init__(self, tensors: CheckpointTensors, hidden: int):
        self._tensors, self._hidden = tensors, hidden

    def get(self, name: str) -> torch.Tensor:
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            return torch.ones(self._hidden)
        return self._tensors.get(name)

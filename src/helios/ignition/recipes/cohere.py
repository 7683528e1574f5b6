"""Recipe for Cohere checkpoints: CohereForCausalLM (Command R / R+) and Cohere2ForCausalLM (Command R7B,
Command A; transformers' CohereConfig / Cohere2Config).

The decoder is Llama's grouped-query attention and gated SiLU MLP with these differences, each an
`Architecture` switch or a preparation step:

- every norm is Cohere's bias-free LayerNorm (``layer_norm``: mean-subtracted, float32, epsilon
  ``layer_norm_eps``), the layers' ``input_layernorm`` and the final ``model.norm``;
- the parallel block (``parallel_block``): a layer's attention and MLP both read its
  ``input_layernorm`` output and their sum is added to the residual stream (no second norm);
- ``logit_scale`` multiplies the logits: folded into the final norm's weight (the norm has no bias
  and the head is linear, so the logits scale with it; tied embeddings keep their lookup);
- interleaved rotary over whole heads (pairs 2i, 2i + 1 at frequency i): each q and k head's rows
  (and biases) are reordered here, pairs de-interleaved into halves as GLM-4's recipe does
  (`helios.ignition.recipes.glm4.rotary_layout`); one permutation of both leaves every q.k unchanged;
- Command R's ``use_qk_norm``: per-head LayerNorms of q and k with one weight row per head
  (``qk_norm_heads``: ``layers.i.q_norm`` [Hq D], ``layers.i.k_norm`` [Hkv D], permuted like q/k);
- ``attention_bias`` puts a bias on q, k, v and o (taken from what the checkpoint holds).

Cohere2 adds sliding layers by ``layer_types`` (default: every fourth layer full, the others
sliding, or a legacy ``sliding_window_pattern``) over ``sliding_window`` (a sliding query sees its
last ``sliding_window`` positions, its own included); its full layers rotate nothing
(``nope_layers``), as Cohere2Attention rotates only where it slides. Cohere2 has no q/k norms. Both
size heads by config.json's ``head_dim`` where it holds one, else ``hidden_size // num_attention_heads``.

The config classes' defaults fill the keys a config.json leaves out (`helios.ignition.recipes.defaults`:
Cohere's rope theta 500000, Cohere2's 10000, ``logit_scale`` 0.0625, tied embeddings, ...). Both
references rotate in float32 and apply the norm weights in float32 before rounding to the dtype; a
float32 core equals them, a bfloat16 one rotates in bfloat16 and may differ in the last bit.
Refused by name: another ``hidden_act``, rope types other than Llama's (default, linear, llama3,
yarn), a partial rotary factor, a null ``head_dim``, a ``logit_scale`` or ``layer_norm_eps`` that is
not a finite number, malformed ``layer_types``, sliding layers without a positive ``sliding_window``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.glm4 import rotary_layout

ARCHITECTURES = ("CohereForCausalLM", "Cohere2ForCausalLM")
LAYER_TYPES = llama.LAYER_TYPES
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps")
_ROTATED = tuple(f"self_attn.{proj}.{kind}" for proj in ("q_proj", "k_proj") for kind in ("weight", "bias"))
_HEAD_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    is_cohere2 = source == "Cohere2ForCausalLM"
    scale, eps = (_finite(config, key) for key in ("logit_scale", "layer_norm_eps"))
    if "head_dim" in config and config["head_dim"] is None:  # the references size heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Cohere references cannot size heads by")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": eps}, tensors, dtype)
    kinds = layer_types(config, base.num_layers) if is_cohere2 else ("full_attention",) * base.num_layers
    arch = dataclasses.replace(
        base, layer_windows=llama.sliding_layer_windows(config, kinds),
        nope_layers=tuple(i for i, kind in enumerate(kinds) if is_cohere2 and kind == "full_attention"),
        layer_norm=True, parallel_block=True, qk_norm=not is_cohere2 and bool(config.get("use_qk_norm")),
        qk_norm_heads=not is_cohere2 and bool(config.get("use_qk_norm")))
    order = rotary_layout(arch.head_dim, arch.head_dim)

    def prepared(name: str, tensor: torch.Tensor) -> torch.Tensor:
        """q/k rows, biases and per-head norms in the de-interleaved order; the final norm scaled."""
        if name.endswith(_ROTATED):
            heads = tensor.reshape(-1, arch.head_dim, *tensor.shape[1:])
            return heads[:, order].reshape(tensor.shape).contiguous()
        if name.endswith(_HEAD_NORMS):  # [heads, D] -> [heads * D]
            return tensor.reshape(-1, arch.head_dim)[:, order].reshape(-1).contiguous()
        if name == "model.norm.weight":
            return tensor * scale
        return tensor

    weights, used = llama.prepared_weights(arch, config, tensors, _layer_weights, transform=prepared)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, as Cohere2Config resolves it: ``layer_types``, else every
    ``sliding_window_pattern``-th layer (default 4) full and the others sliding."""
    kinds = config.get("layer_types")
    if kinds is None:
        pattern = config.get("sliding_window_pattern", 4)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise UnsupportedCheckpoint(f"config.json: sliding_window_pattern {pattern!r} must be a positive count")
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers))
    return llama.listed_layer_types(kinds, num_layers)


def _finite(config: Mapping[str, Any], key: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UnsupportedCheckpoint(f"config.json: {key} must be a finite number, got {value!r}")
    if key == "layer_norm_eps" and value < 0:
        raise UnsupportedCheckpoint(f"config.json: layer_norm_eps {value} is negative")
    return float(value)


def _layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    return llama.attention_block_weights(arch, layer, take) + llama.dense_mlp_weights(arch, layer, take)

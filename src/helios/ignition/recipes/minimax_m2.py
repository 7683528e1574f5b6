"""Recipe for MiniMax-M2 checkpoints (MiniMaxM2ForCausalLM: MiniMax-M2 / M2.1).

Llama's attention and norms (`helios.ignition.recipes.llama`, full causal attention: the reference
reads no window) with, as MiniMaxM2Config and MiniMaxM2Model read them:

- q/k RMS norms over the whole q and k projections (``self_attn.q_norm.weight`` [Hq D],
  ``k_norm`` [Hkv D]; `Architecture.qk_norm_whole`, as OLMoE's), applied before the rotation;
- partial rotary: ``rotary_dim`` (the legacy key, read as partial_rotary_factor = rotary_dim /
  head_dim where config.json gives no factor) or ``partial_rotary_factor``; the rotated dimensions
  are reordered as GLM-4.5's (`moe.partial_rotary`), the whole-projection q/k norm weights with
  each head's rows;
- a mixture of experts in every layer: sigmoid scores of a float32 router
  (``block_sparse_moe.gate.weight``), the top ``num_experts_per_tok`` chosen by score plus
  ``e_score_correction_bias`` and weighted by their scores renormalised to sum 1 (DeepSeek-V3's
  routing with one group, ``helios::moe_route``), experts ``block_sparse_moe.experts.N.w1`` (gate) /
  ``w3`` (up) / ``w2`` (down) of width ``intermediate_size``; no shared expert.

The reference always norms q and k and always routes by sigmoid whatever the informational keys
(``use_qk_norm``, ``qk_norm_type``, ``scoring_func``, ``use_routing_bias``) say. Keys config.json
leaves out take MiniMaxM2Config's defaults. Multi-token-prediction modules are not served; their
tensors, if a checkpoint holds any, are refused by name as unused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama, moe
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("MiniMaxM2ForCausalLM",)
_NAMES = moe.ExpertNames("block_sparse_moe.", "w1", "w3", "w2", router="gate.weight",
                         correction_bias="e_score_correction_bias")
# MiniMaxM2Config's defaults for the keys this recipe reads.
_DEFAULTS = {"rope_theta": 5000000.0, "rms_norm_eps": 1e-6, "head_dim": 128, "num_key_value_heads": 8,
             "num_experts_per_tok": 8, "num_local_experts": 256, "intermediate_size": 1536}
_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = _with_rotary_factor({**_DEFAULTS, **config})
    base = llama.architecture_from_config(source, config, tensors, dtype)
    if not base.qk_norm:
        raise UnsupportedCheckpoint(f"{source} checkpoint has no q/k norm tensors (self_attn.q_norm.weight), "
                                    f"which every MiniMax-M2 layer holds")
    experts = MixtureOfExperts(int(config["num_local_experts"]), int(config["num_experts_per_tok"]),
                               int(config["intermediate_size"]), tuple(range(base.num_layers)), scoring="sigmoid",
                               normalize=True, correction_bias=True)
    arch = dataclasses.replace(base, moe=experts, intermediate_size=0, qk_norm_whole=True)
    rotary = llama.rotary_width(config, arch.head_dim)
    inv_freq, transform = None, None
    if rotary < arch.head_dim:
        inv_freq, transform = _partial_rotary(config, arch.head_dim, rotary)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return llama.attention_weights(arch, layer, take) + moe.sparse_weights(arch, layer, take, tensors, _NAMES)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq, transform)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def _with_rotary_factor(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with ``rotary_dim`` read as MiniMaxM2Config reads it: partial_rotary_factor =
    rotary_dim / head_dim unless config.json gives a factor itself."""
    rotary_dim = config.get("rotary_dim")
    if rotary_dim is None or "partial_rotary_factor" in config:
        return config
    head_dim = config["head_dim"] or int(config["hidden_size"]) // int(config["num_attention_heads"])
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or not 0 < rotary_dim <= head_dim:
        raise UnsupportedCheckpoint(f"config.json: rotary_dim {rotary_dim!r} must be a positive count of at most "
                                    f"head_dim {head_dim}")
    return {**config, "partial_rotary_factor": rotary_dim / head_dim}


def _partial_rotary(config: Mapping[str, Any], head_dim: int, rotary: int):
    """`moe.partial_rotary`'s frequencies and reordering, with the whole-projection q/k norm weights
    reordered head by head like the q/k rows they scale."""
    inv_freq, rows = moe.partial_rotary(config, head_dim, rotary)
    order = moe.rotary_order(head_dim, rotary)

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith(_NORMS):
            return tensor.reshape(-1, head_dim)[:, order].reshape(tensor.shape).contiguous()
        return rows(name, tensor)

    return inv_freq, transform

"""Recipe for OLMoE checkpoints (OlmoeForCausalLM).

Llama's pre-norm decoder (the llama recipe prepares attention, its biases and rope settings; full
causal attention: the reference masks causally whatever ``sliding_window`` says) with:

- q/k RMS norms over the whole q and k projections before the heads split (``qk_norm_whole``, as
  OLMo 2's: weights [Hq D] and [Hkv D]; the reference sizes them by ``hidden_size``, so D is
  hidden_size / num_attention_heads and an explicit other ``head_dim`` is refused);
- a mixture of experts in every layer (`helios.ignition.recipes.moe`'s stacked layout): a float32
  router, softmax over every expert then the top ``num_experts_per_tok``, renormalised only with
  ``norm_topk_prob`` (default False), experts of width ``intermediate_size``; no shared expert;
- q/k/v/o biases where ``attention_bias`` (taken from the tensors the checkpoint holds).

``clip_qkv`` (OLMo's clamp of q, k and v) is refused by name, not ignored; so are a partial rotary
factor (the reference rotates whole heads) and activations other than SiLU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import MixtureOfExperts
from helios.ignition.recipes import llama, moe
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("OlmoeForCausalLM",)
_NAMES = moe.ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    _refuse_unsupported(config)
    base = llama.architecture_from_config(source, config, tensors, dtype)
    if not base.qk_norm:
        raise UnsupportedCheckpoint(f"{source} checkpoint has no q/k norm tensors (self_attn.q_norm.weight), "
                                    f"which every OLMoE layer holds")
    experts = MixtureOfExperts(int(config["num_experts"]), int(config["num_experts_per_tok"]),
                               int(config["intermediate_size"]), tuple(range(base.num_layers)),
                               normalize=bool(config.get("norm_topk_prob", False)))
    arch = dataclasses.replace(base, moe=experts, intermediate_size=0, qk_norm_whole=True)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads

    def layer_weights(arch, layer: int, take):
        return llama.attention_weights(arch, layer, take) + moe.sparse_weights(arch, layer, take, tensors, _NAMES)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    if config.get("clip_qkv") is not None:
        raise UnsupportedCheckpoint(f"config.json: clip_qkv {config['clip_qkv']!r} is not supported (only null: "
                                    f"q, k and v unclamped)")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if hidden % heads:
        raise UnsupportedCheckpoint(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} (the "
                                    f"reference sizes its q/k norms by hidden_size)")
    if config.get("head_dim") not in (None, hidden // heads):
        raise UnsupportedCheckpoint(f"config.json: head_dim {config['head_dim']} is not hidden_size / "
                                    f"num_attention_heads {hidden // heads} (the reference's q/k norms span "
                                    f"hidden_size)")

"""Recipe for LFM2 checkpoints (Lfm2ForCausalLM, Lfm2MoeForCausalLM): hybrids of gated short
convolutions and attention.

``layer_types`` (or, where missing, ``full_attn_idxs``: the attention layers, every layer when null,
as Lfm2Config derives it) names each layer ``conv`` - a gated short convolution (LFM2's ShortConv:
y = C conv(B x), its window of ``conv_L_cache`` - 1 inputs in state rows;
`helios.ignition.recurrent_geometry.ShortConvGeometry`, `helios.ignition.short_conv`) - or
``full_attention``: grouped-query rotary attention with per-head q/k RMS norms before the rotation.
Every layer has ``operator_norm`` before its mixer and ``ffn_norm`` before a gated SiLU MLP
(w1 gate, w3 up, w2 down); ``embedding_norm`` is the final norm. ``conv_bias`` gives both
projections and the convolution of the short convolutions their biases. The MLP's width is
``intermediate_size``, or under ``block_auto_adjust_ff_dim`` 2/3 of it (times
``block_ffn_dim_multiplier`` and rounded up to ``block_multiple_of`` where the multiplier is set),
as Lfm2MLP sizes it.

LFM2-MoE (Lfm2MoeForCausalLM): the same layers; the first ``num_dense_layers`` have the gated MLP of
``intermediate_size`` (not adjusted), the others a mixture of ``num_experts`` gated SiLU experts of
``moe_intermediate_size`` (w1, w3, w2 each) routed by sigmoid scores: the top ``num_experts_per_tok`` of
the scores plus ``expert_bias`` (``use_expert_bias``; the bias only chooses), their sigmoid weights
renormalised (``norm_topk_prob``) and scaled by ``routed_scaling_factor`` (`MixtureOfExperts`, no
shared expert). The reference divides by the weights' sum + 1e-6, ``helios::moe_route`` by the sum +
1e-20: the weights differ by a factor 1 / (1 + 1e-6 / sum), below float32 rounding's effect on logits
for sums of top-k sigmoids (each in (0, 1)) that are not tiny.

Refused by name: rope types other than the default, layer kinds other than the two, a decoder
without a short convolution layer (a plain decoder, which LFM2 checkpoints are not).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import bamba, llama
from helios.ignition.recipes.base import (NamedWeight, Recipe, UnsupportedCheckpoint, conv_weight, fused,
                                         hybrid_layer_kinds)
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import ExpertNames, sparse_weights
from helios.ignition.recurrent_geometry import ShortConvGeometry

ARCHITECTURES = ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM")
_EXPERTS = ExpertNames("feed_forward.", "w1", "w3", "w2", router="gate.weight", correction_bias="expert_bias")
LAYER_KINDS = ("conv", "full_attention")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(source, config, tensors, dtype)
    weights, used = prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def layer_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's kind, from ``layer_types`` or Lfm2Config's ``full_attn_idxs`` rule."""
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is None:
        attention = config.get("full_attn_idxs")
        attention = set(range(num_layers) if attention is None else attention)
        kinds = ["full_attention" if i in attention else "conv" for i in range(num_layers)]
    return hybrid_layer_kinds(kinds, num_layers, LAYER_KINDS, ("conv",), "a hybrid with short convolutions")


def mlp_width(config: Mapping[str, Any]) -> int:
    """Lfm2MLP's intermediate width."""
    width = int(config["intermediate_size"])
    if config.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = config.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            multiple = int(config.get("block_multiple_of", 256))
            if multiple < 1:
                raise UnsupportedCheckpoint(f"block_multiple_of {multiple} must be >= 1")
            width = int(multiplier * width)
            width = multiple * ((width + multiple - 1) // multiple)
    return width


def mixture(source: str, config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts | None:
    """LFM2-MoE's sparse layers (all after the first num_dense_layers; None: none, or LFM2)."""
    if source != "Lfm2MoeForCausalLM":
        return None
    dense = int(config.get("num_dense_layers", 2))
    if dense < 0:
        raise UnsupportedCheckpoint(f"num_dense_layers {dense} must be >= 0")
    sparse = tuple(range(dense, num_layers))
    if not sparse:
        return None
    return MixtureOfExperts(int(config["num_experts"]), int(config["num_experts_per_tok"]),
                            int(config["moe_intermediate_size"]), sparse, scoring="sigmoid",
                            normalize=bool(config.get("norm_topk_prob", True)),
                            scale=float(config.get("routed_scaling_factor", 1.0)),
                            correction_bias=bool(config.get("use_expert_bias", True)))


def architecture_from_config(source: str, config: Mapping[str, Any], tensors: CheckpointTensors,
                             dtype: str | None) -> Architecture:
    rope = llama.rope_parameters(config)  # refuses a partial rotary factor: the reference rotates whole heads
    if rope["rope_type"] != "default":
        raise UnsupportedCheckpoint(f"rope_type {rope['rope_type']!r} is not supported (only 'default')")
    hidden, num_layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    num_heads = int(config["num_attention_heads"])
    kinds = layer_kinds(config)
    bias = bool(config.get("conv_bias", False))
    moe = mixture(source, config, num_layers)
    if moe is None:
        width = mlp_width(config) if source == "Lfm2ForCausalLM" else int(config["intermediate_size"])
    else:
        width = int(config["intermediate_size"]) if len(moe.sparse_layers) < num_layers else 0
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden, intermediate_size=width, moe=moe,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads), rms_norm_eps=float(config.get("norm_eps", 1e-5)),
        layer_windows=(0,) * num_layers, qk_norm=True,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", config.get("tie_embedding", True))),
        dtype=dtype or bamba.checkpoint_dtype(config, tensors),
        recurrent=ShortConvGeometry(layers=tuple(i for i, kind in enumerate(kinds) if kind == "conv"),
                                    channels=hidden, conv_kernel=int(config.get("conv_L_cache", 3)), bias=bias),
    )


def prepared_weights(arch: Architecture, config: Mapping[str, Any], tensors: CheckpointTensors):
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    g: ShortConvGeometry = arch.recurrent
    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        weights.append(NamedWeight(dst + "input_norm", take(src + "operator_norm.weight")))
        if layer in g.layers:
            conv, short = src + "conv.", dst + "short."
            weights.append(NamedWeight(short + "in_proj.weight", take(conv + "in_proj.weight")))
            if g.bias:
                weights.append(NamedWeight(short + "in_proj.bias", take(conv + "in_proj.bias")))
            conv_bias = take(conv + "conv.bias") if g.bias else torch.zeros(g.conv_dim, dtype=arch.torch_dtype)
            conv_weights = conv_weight(take(conv + "conv.weight"), conv + "conv.weight", g.conv_dim, g.conv_kernel)
            weights += [NamedWeight(short + "conv.weight", conv_weights),
                        NamedWeight(short + "conv.bias", conv_bias),
                        NamedWeight(short + "out.weight", take(conv + "out_proj.weight"))]
            if g.bias:
                weights.append(NamedWeight(short + "out.bias", take(conv + "out_proj.bias")))
        else:
            attn = src + "self_attn."
            weights += [NamedWeight(dst + "qkv.weight", fused(take, [attn + f"{n}_proj.weight" for n in "qkv"])),
                        NamedWeight(dst + "q_norm", take(attn + "q_layernorm.weight")),
                        NamedWeight(dst + "k_norm", take(attn + "k_layernorm.weight")),
                        NamedWeight(dst + "o.weight", take(attn + "out_proj.weight"))]
        mlp = src + "feed_forward."
        weights.append(NamedWeight(dst + "post_norm", take(src + "ffn_norm.weight")))
        if arch.is_sparse(layer):
            weights += sparse_weights(arch, layer, take, tensors, _EXPERTS)
        else:
            weights += [NamedWeight(dst + "gate_up.weight", fused(take, [mlp + "w1.weight", mlp + "w3.weight"])),
                        NamedWeight(dst + "down.weight", take(mlp + "w2.weight"))]
    weights.append(NamedWeight("final_norm", take("model.embedding_norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", llama.rope_inv_freq(config, arch.rotary_width)))
    return tuple(weights), used

"""Recipe for Kimi Linear checkpoints (KimiLinearForCausalLM): Kimi Delta Attention layers beside
multi-head latent attention, experts after the first dense layers.

``layer_types`` (or ``linear_attn_config``'s 1-indexed ``kda_layers`` / ``full_attn_layers``, or
KimiLinearConfig's rule: every fourth layer from layer 4 attends) names each layer ``linear_attention`` -
Kimi Delta Attention (`helios.ignition.recurrent_geometry.KimiDeltaGeometry`, `helios.ignition.kimi_mixer`:
the gated delta rule with a decay per key channel, ``helios::gated_delta_rule`` with g [T, H, D]) of
``linear_attn_config``'s ``num_heads`` heads of ``head_dim`` - or ``full_attention``: DeepSeek's latent
attention (`LatentAttention`, its latent norms' epsilon 1e-6) without positions (the reference rotates
nothing: the prepared ``rope.inv_freq`` is zeros, whose tables leave the shared key part as projected).
``mlp_layer_types`` (or ``first_k_dense_replace``) picks dense gated MLPs or the mixture: sigmoid routing
with the correction bias over expert groups (``num_expert_group`` / ``topk_group``), renormalised
(``moe_renormalize``) and scaled (``routed_scaling_factor``), beside ``num_shared_experts`` shared experts.

Tensor names: the released checkpoints' (``block_sparse_moe.*``, the convolution as ``q_conv1d`` /
``k_conv1d`` / ``v_conv1d``) or the loaded model's (``mlp.*``, ``conv1d``). Refused by name: an
activation other than SiLU, ``attention_bias``, fewer key/value heads than heads, layer kinds other than
the two, a decoder without both kinds, and tensor parallelism (`helios.ignition.sharding`).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, LatentAttention, MixtureOfExperts
from helios.ignition.recipes import bamba
from helios.ignition.recipes.base import (NamedWeight, Recipe, UnsupportedCheckpoint, conv_weight, fused,
                                         hybrid_layer_kinds)
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.deepseek import check_key_heads
from helios.ignition.recipes.llama import placed_recipe
from helios.ignition.recipes.moe import ExpertNames, sparse_weights
from helios.ignition.recurrent_geometry import KimiDeltaGeometry

ARCHITECTURES = ("KimiLinearForCausalLM",)
LAYER_KINDS = ("linear_attention", "full_attention")
LATENT_NORM_EPS = 1e-6  # KimiLinearRMSNorm's default, which the latent norms take


def _get(config: Mapping[str, Any], names: tuple[str, ...], default=None):
    """The first of `names` (KimiLinearConfig's attribute map spells some keys two ways) set in config."""
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(config, tensors, dtype)
    weights, used = prepared_weights(arch, tensors)
    return placed_recipe(source, arch, weights, used, tensors)


def layer_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's kind (KimiLinearConfig's rules)."""
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    linear = config.get("linear_attn_config") or {}
    if kinds is None and "full_attn_layers" in linear and "kda_layers" in linear:
        kinds = [None] * num_layers
        for layer in linear["full_attn_layers"]:
            kinds[layer - 1] = "full_attention"
        for layer in linear["kda_layers"]:
            kinds[layer - 1] = "linear_attention"
    elif kinds is None:
        kinds = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(num_layers)]
    return hybrid_layer_kinds(kinds, num_layers, LAYER_KINDS)


def mixture(config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts | None:
    kinds = config.get("mlp_layer_types")
    if kinds is None:
        first = int(config.get("first_k_dense_replace", 1))
        kinds = ["dense" if i < first else "sparse" for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= {"dense", "sparse"}:
        raise UnsupportedCheckpoint(f"mlp_layer_types {list(kinds)} must give each of the {num_layers} layers "
                                    f"'dense' or 'sparse'")
    sparse = tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
    if not sparse:
        return None
    width = int(config["moe_intermediate_size"])
    return MixtureOfExperts(
        int(_get(config, ("num_experts", "num_local_experts"), 256)),
        int(_get(config, ("num_experts_per_token", "num_experts_per_tok"), 8)), width, sparse, scoring="sigmoid",
        num_groups=int(_get(config, ("num_expert_group", "n_group"), 1)), topk_groups=int(config.get("topk_group") or 1),
        normalize=bool(_get(config, ("moe_renormalize", "norm_topk_prob"), True)),
        scale=float(config.get("routed_scaling_factor", 2.446)), correction_bias=True,
        shared_intermediate_size=width * int(_get(config, ("num_shared_experts", "n_shared_experts"), 1)))


def architecture_from_config(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    if config.get("attention_bias"):
        raise UnsupportedCheckpoint("attention_bias is not supported (the latent projections without biases)")
    check_key_heads(config)
    num_layers, num_heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    kinds = layer_kinds(config)
    linear = config.get("linear_attn_config") or {}
    rope_dim, nope_dim = int(config["qk_rope_head_dim"]), int(config["qk_nope_head_dim"])
    latent = LatentAttention(kv_lora_rank=int(config["kv_lora_rank"]), qk_nope_head_dim=nope_dim,
                             qk_rope_head_dim=rope_dim, v_head_dim=int(config["v_head_dim"]),
                             scale=(nope_dim + rope_dim) ** -0.5, q_lora_rank=int(config.get("q_lora_rank") or 0),
                             norm_eps=LATENT_NORM_EPS)
    moe = mixture(config, num_layers)
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]) if moe is None or len(moe.sparse_layers) < num_layers
        else 0, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_heads, head_dim=rope_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)), layer_windows=(0,) * num_layers,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or bamba.checkpoint_dtype(config, tensors), latent=latent, moe=moe,
        recurrent=KimiDeltaGeometry(
            layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
            num_heads=int(linear.get("num_heads", config.get("linear_num_heads", 32))),
            head_dim=int(linear.get("head_dim", config.get("linear_head_dim", 128))),
            conv_kernel=int(linear.get("short_conv_kernel_size", config.get("linear_conv_kernel_dim", 4)))),
    )


def prepared_weights(arch: Architecture, tensors: CheckpointTensors):
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    def exact(name: str) -> torch.Tensor:  # float32 parameters the reference keeps in float32
        used.add(name)
        return tensors.get(name).to(torch.float32)

    g: KimiDeltaGeometry = arch.recurrent
    latent = arch.latent
    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        attn = src + "self_attn."
        weights.append(NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")))
        if layer in g.layers:
            p = dst + "kda."
            if attn + "conv1d.weight" in tensors:
                conv, conv_name = take(attn + "conv1d.weight"), attn + "conv1d.weight"
            else:
                conv = fused(take, [attn + f"{name}_conv1d.weight" for name in "qkv"])
                conv_name = attn + "{q,k,v}_conv1d.weight"
            weights += [
                NamedWeight(p + "in_proj.weight", fused(take, [attn + f"{name}_proj.weight" for name in "qkvb"])),
                NamedWeight(p + "conv.weight", conv_weight(conv, conv_name, g.conv_dim, g.conv_kernel)),
                NamedWeight(p + "conv.bias", torch.zeros(g.conv_dim, dtype=arch.torch_dtype)),
                NamedWeight(p + "f_a.weight", take(attn + "f_a_proj.weight")),
                NamedWeight(p + "f_b.weight", take(attn + "f_b_proj.weight")),
                NamedWeight(p + "dt_bias", exact(attn + "dt_bias")),
                NamedWeight(p + "A", -torch.exp(exact(attn + "A_log").reshape(g.num_heads))),
                NamedWeight(p + "g_a.weight", take(attn + "g_a_proj.weight")),
                NamedWeight(p + "g_b.weight", take(attn + "g_b_proj.weight")),
                NamedWeight(p + "norm", take(attn + "o_norm.weight")),
                NamedWeight(p + "out.weight", take(attn + "o_proj.weight"))]
        else:
            if latent.q_lora_rank:
                weights += [NamedWeight(dst + "q_a.weight", take(attn + "q_a_proj.weight")),
                            NamedWeight(dst + "q_a_norm", take(attn + "q_a_layernorm.weight")),
                            NamedWeight(dst + "q_b.weight", take(attn + "q_b_proj.weight"))]
            else:
                weights.append(NamedWeight(dst + "q.weight", take(attn + "q_proj.weight")))
            weights += [NamedWeight(dst + "kv_a.weight", take(attn + "kv_a_proj_with_mqa.weight")),
                        NamedWeight(dst + "kv_a_norm", take(attn + "kv_a_layernorm.weight")),
                        NamedWeight(dst + "kv_b.weight", take(attn + "kv_b_proj.weight")),
                        NamedWeight(dst + "o.weight", take(attn + "o_proj.weight"))]
        weights.append(NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")))
        block = "block_sparse_moe." if src + "block_sparse_moe.gate.weight" in tensors or \
            src + "block_sparse_moe.gate_proj.weight" in tensors else "mlp."
        if arch.is_sparse(layer):
            names = ExpertNames(block, "w1", "w3", "w2", "shared_experts.")
            if src + block + "experts.0.gate_proj.weight" in tensors:
                names = ExpertNames(block, "gate_proj", "up_proj", "down_proj", "shared_experts.")
            weights += sparse_weights(arch, layer, take, tensors, names)
        else:
            weights += [NamedWeight(dst + "gate_up.weight", fused(take, [src + block + "gate_proj.weight",
                                                                          src + block + "up_proj.weight"])),
                        NamedWeight(dst + "down.weight", take(src + block + "down_proj.weight"))]
    weights.append(NamedWeight("final_norm", take("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", torch.zeros(arch.rotary_width // 2, dtype=torch.float32)))
    return tuple(weights), used

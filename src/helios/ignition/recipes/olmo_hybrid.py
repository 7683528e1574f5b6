"""Recipe for OLMo Hybrid checkpoints (OlmoHybridForCausalLM): Gated DeltaNet layers and OLMo 2 / 3
attention layers.

``layer_types`` (or, where missing, OlmoHybridConfig's rule: every fourth layer attends, the last one
where none would) names each layer ``linear_attention`` - a pre-norm Gated DeltaNet layer
(`helios.ignition.delta_mixer`; separate q, k, v, a, b and output-gate ``g_proj`` projections, prepared
into the q | k | v | z | b | a rows of ``delta.in_proj``; beta doubled under ``linear_allow_neg_eigval``,
`GatedDeltaNetGeometry.beta_scale`; its gated output norm's epsilon fixed at 1e-5, as the reference
builds it, `GatedDeltaNetGeometry.norm_eps`) followed by ``post_attention_layernorm`` and a gated SiLU
MLP - or ``full_attention``: OLMo 2's block (`Architecture.post_norm_attention`): no pre-norms, RMS
norms over the whole q and k projections, ``post_attention_layernorm`` on the attention's output and
``post_feedforward_layernorm`` on the MLP's. With ``rope_parameters``' ``rope_theta`` null the
reference rotates nothing (NoPE): the prepared ``rope.inv_freq`` is zeros,
whose tables (cos 1, sin 0) leave queries and keys exactly as projected.

Refused by name: an activation other than SiLU, rope types other than the default, a partial rotary
factor, layer kinds other than the two, a decoder without both kinds.

Tensor names: the released checkpoints' (transformers' conversion mapping: ``attention_layer_norm`` and
``feedforward_layer_norm`` for ``input_layernorm`` and ``post_attention_layernorm``, the convolution as
``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``), or the loaded model's own.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import bamba, llama
from helios.ignition.recipes.base import (NamedWeight, Recipe, UnsupportedCheckpoint, conv_weight, fused,
                                         hybrid_layer_kinds)
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recurrent_geometry import GatedDeltaNetGeometry

ARCHITECTURES = ("OlmoHybridForCausalLM",)
LAYER_KINDS = ("linear_attention", "full_attention")
OUTPUT_NORM_EPS = 1e-5  # OlmoHybridGatedDeltaNet's o_norm: eps=1e-5 whatever rms_norm_eps says


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(config, tensors, dtype)
    weights, used = prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def layer_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's kind, from ``layer_types`` or OlmoHybridConfig's rule."""
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is None:
        kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(num_layers)]
        if "full_attention" not in kinds:
            kinds[-1] = "full_attention"
    return hybrid_layer_kinds(kinds, num_layers, LAYER_KINDS)


def rotates(config: Mapping[str, Any]) -> bool:
    """Whether the reference builds rotary tables: unless ``rope_parameters`` sets ``rope_theta`` null
    (missing or null settings take the config class's default theta)."""
    params = config.get("rope_parameters")
    return not (isinstance(params, dict) and "rope_theta" in params and params["rope_theta"] is None)


def architecture_from_config(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    if rotates(config):
        rope = llama.rope_parameters(config)  # refuses a partial rotary factor: the reference rotates whole heads
        if rope["rope_type"] != "default":
            raise UnsupportedCheckpoint(f"rope_type {rope['rope_type']!r} is not supported (only 'default')")
    hidden, num_layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    num_heads = int(config["num_attention_heads"])
    kinds = layer_kinds(config)
    key_heads = int(config.get("linear_num_key_heads") or num_heads)
    key_dim = int(config.get("linear_key_head_dim") or int(0.75 * hidden / key_heads))
    bias = bool(config.get("attention_bias", False))
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden, intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads), rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        layer_windows=(0,) * num_layers, qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_whole=True,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or bamba.checkpoint_dtype(config, tensors), post_norm_attention=True,
        recurrent=GatedDeltaNetGeometry(
            layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
            num_key_heads=key_heads, num_value_heads=int(config.get("linear_num_value_heads") or num_heads),
            key_head_dim=key_dim, value_head_dim=int(config.get("linear_value_head_dim") or 2 * key_dim),
            conv_kernel=int(config.get("linear_conv_kernel_dim", 4)),
            beta_scale=2.0 if config.get("linear_allow_neg_eigval", True) else 1.0, norm_eps=OUTPUT_NORM_EPS),
    )


def prepared_weights(arch: Architecture, config: Mapping[str, Any], tensors: CheckpointTensors):
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    def either(released: str, loaded: str) -> torch.Tensor:  # the released spelling, or transformers' own
        return take(released if released in tensors else loaded)

    g: GatedDeltaNetGeometry = arch.recurrent
    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        mlp = [NamedWeight(dst + "gate_up.weight", fused(take, [src + "mlp.gate_proj.weight",
                                                                 src + "mlp.up_proj.weight"])),
               NamedWeight(dst + "down.weight", take(src + "mlp.down_proj.weight"))]
        if layer in g.layers:
            attn = src + "linear_attn."
            used.add(attn + "A_log")
            if attn + "conv1d.weight" in tensors:
                conv, conv_name = take(attn + "conv1d.weight"), attn + "conv1d.weight"
            else:
                conv = fused(take, [attn + f"{name}_conv1d.weight" for name in "qkv"])
                conv_name = attn + "{q,k,v}_conv1d.weight"
            weights += [
                NamedWeight(dst + "input_norm", either(src + "attention_layer_norm.weight",
                                                        src + "input_layernorm.weight")),
                NamedWeight(dst + "delta.in_proj.weight",
                            fused(take, [attn + f"{name}_proj.weight" for name in ("q", "k", "v", "g", "b", "a")])),
                NamedWeight(dst + "delta.conv.weight", conv_weight(conv, conv_name, g.conv_dim, g.conv_kernel)),
                NamedWeight(dst + "delta.conv.bias", torch.zeros(g.conv_dim, dtype=arch.torch_dtype)),
                NamedWeight(dst + "delta.dt_bias", take(attn + "dt_bias")),
                NamedWeight(dst + "delta.A", -torch.exp(tensors.get(attn + "A_log").to(torch.float32))),
                NamedWeight(dst + "delta.norm", take(attn + "o_norm.weight")),
                NamedWeight(dst + "delta.out.weight", take(attn + "o_proj.weight")),
                NamedWeight(dst + "post_norm", either(src + "feedforward_layer_norm.weight",
                                                       src + "post_attention_layernorm.weight")), *mlp]
        else:
            attn = src + "self_attn."
            weights.append(NamedWeight(dst + "qkv.weight", fused(take, [attn + f"{n}_proj.weight" for n in "qkv"])))
            if arch.qkv_bias:
                weights.append(NamedWeight(dst + "qkv.bias", fused(take, [attn + f"{n}_proj.bias" for n in "qkv"])))
            weights += [NamedWeight(dst + "q_norm", take(attn + "q_norm.weight")),
                        NamedWeight(dst + "k_norm", take(attn + "k_norm.weight")),
                        NamedWeight(dst + "o.weight", take(attn + "o_proj.weight"))]
            if arch.o_bias:
                weights.append(NamedWeight(dst + "o.bias", take(attn + "o_proj.bias")))
            weights += [NamedWeight(dst + "attn_out_norm", either(src + "feedforward_layer_norm.weight",
                                                                   src + "post_attention_layernorm.weight")), *mlp,
                        NamedWeight(dst + "mlp_out_norm", take(src + "post_feedforward_layernorm.weight"))]
    weights.append(NamedWeight("final_norm", take("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    inv_freq = llama.rope_inv_freq(config, arch.rotary_width) if rotates(config) else torch.zeros(
        arch.rotary_width // 2, dtype=torch.float32)
    weights.append(NamedWeight("rope.inv_freq", inv_freq))
    return tuple(weights), used

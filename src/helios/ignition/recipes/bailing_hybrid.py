"""Recipe for Bailing hybrid checkpoints (BailingHybridForCausalLM, Ling 3): Kimi Delta Attention layers
beside gated latent attention, experts after the dense layers.

Kimi Linear's dataflow (`helios.ignition.recipes.kimi_linear`) with: full-rank forget and output gates
(``f_proj`` / ``g_proj``: `KimiDeltaGeometry.low_rank_gates` off); under ``kda_safe_gate`` the log decay
``kda_lower_bound`` sigmoid(exp(A_log) (f x + dt_bias)) (`KimiDeltaGeometry.lower_bound`); the linear
attention's ``num_attention_heads`` heads of ``head_dim``; latent attention whose rotary part turns
(interleaved pairs in the checkpoint, de-interleaved here as DeepSeek's are) and whose heads are each gated
by sigmoid(``g_proj`` x) before the output projection (`LatentAttention.head_gate`); ``layer_types`` or
every ``layer_group_size``-th layer attending. In bfloat16 the reference also rounds the decay to the model
dtype and convolves in float32; the programs keep the decay in float32 and convolve in the model dtype.

Tensor names: the released checkpoints' (``word_embeddings``, ``attention.*``, ``dense``, the convolution as
``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``, ``gate.expert_bias``). Refused by name: an activation other than
SiLU, ``attention_bias``, fewer key/value heads than heads, rope types other than the default, non-zero
SwiGLU limits (``swiglu_limits`` / ``swiglu_limits_shared``), layer kinds other than the two, a decoder
without both kinds, and tensor parallelism (`helios.ignition.sharding`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, LatentAttention
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import (NamedWeight, Recipe, UnsupportedCheckpoint, conv_weight, fused,
                                         hybrid_layer_kinds)
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.deepseek import _HeadRows, check_key_heads
from helios.ignition.recipes.kimi_linear import LAYER_KINDS, LATENT_NORM_EPS, mixture
from helios.ignition.recipes.moe import ExpertNames, sparse_weights
from helios.ignition.recurrent_geometry import KimiDeltaGeometry

ARCHITECTURES = ("BailingHybridForCausalLM",)
_EXPERTS = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj", "shared_experts.", correction_bias="gate.expert_bias")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(config, tensors, dtype)
    weights, used = prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def layer_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's kind: ``layer_types``, or BailingHybridConfig's every ``layer_group_size``-th layer."""
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is None:
        group = int(config.get("layer_group_size", 6))
        if group < 1:
            raise UnsupportedCheckpoint(f"layer_group_size {group} must be >= 1")
        kinds = ["full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(num_layers)]
    return hybrid_layer_kinds(kinds, num_layers, LAYER_KINDS)


def rope_theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rope_theta", 6e6)}
    if params.get("rope_type", "default") != "default":
        raise UnsupportedCheckpoint(f"rope_type {params.get('rope_type')!r} is not supported (only 'default')")
    if "partial_rotary_factor" in params:
        raise UnsupportedCheckpoint("partial_rotary_factor is not supported (the latent rotary part turns whole)")
    return float(params.get("rope_theta", config.get("rope_theta", 6e6)))


def architecture_from_config(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    if config.get("attention_bias"):
        raise UnsupportedCheckpoint("attention_bias is not supported (the latent projections without biases)")
    for key in ("swiglu_limits", "swiglu_limits_shared", "expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        if any(config.get(key) or ()):
            raise UnsupportedCheckpoint(f"{key} {config.get(key)!r:.80} is not supported (only no SwiGLU limit)")
    check_key_heads(config)
    rope_theta(config)
    linear_dim = int(config.get("head_dim", 128))  # BailingHybridConfig's linear_head_dim is head_dim as read
    if config.get("linear_head_dim") not in (None, linear_dim):
        # transformers saves head_dim overwritten by qk_rope_head_dim and reloads the linear heads at it: such a
        # config's reference cannot load its own weights
        raise UnsupportedCheckpoint(f"linear_head_dim {config['linear_head_dim']} differs from head_dim {linear_dim}, "
                                    f"which the reference sizes the linear-attention heads by")
    num_layers, num_heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    kinds = layer_kinds(config)
    rope_dim, nope_dim = int(config["qk_rope_head_dim"]), int(config["qk_nope_head_dim"])
    latent = LatentAttention(kv_lora_rank=int(config["kv_lora_rank"]), qk_nope_head_dim=nope_dim,
                             qk_rope_head_dim=rope_dim, v_head_dim=int(config["v_head_dim"]),
                             scale=(nope_dim + rope_dim) ** -0.5, q_lora_rank=int(config.get("q_lora_rank") or 0),
                             norm_eps=LATENT_NORM_EPS, head_gate=True)
    moe = mixture(config, num_layers)  # the same config keys (BailingHybridConfig's attribute map is Kimi's)
    safe = bool(config.get("kda_safe_gate", True))
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]) if moe is None or len(moe.sparse_layers) < num_layers
        else 0, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_heads, head_dim=rope_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), layer_windows=(0,) * num_layers,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or _checkpoint_dtype(config, tensors), latent=latent, moe=moe,
        recurrent=KimiDeltaGeometry(
            layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"), num_heads=num_heads,
            head_dim=linear_dim, conv_kernel=int(config.get("short_conv_kernel_size", 4)),
            low_rank_gates=False, lower_bound=float(config.get("kda_lower_bound", -5.0)) if safe else 0.0),
    )


def _checkpoint_dtype(config: Mapping[str, Any], tensors: CheckpointTensors) -> str:
    name = "model.word_embeddings.weight" if "model.word_embeddings.weight" in tensors else "model.embed_tokens.weight"
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared in ("float32", "bfloat16", "float16"):
        return declared
    return str(tensors.get(name).dtype).removeprefix("torch.")


def prepared_weights(arch: Architecture, config: Mapping[str, Any], tensors: CheckpointTensors):
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    def exact(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(torch.float32)

    g: KimiDeltaGeometry = arch.recurrent
    heads = _HeadRows(dataclasses.replace(arch), interleaved=True)
    embed = "model.word_embeddings.weight" if "model.word_embeddings.weight" in tensors else "model.embed_tokens.weight"
    weights = [NamedWeight("embed", take(embed))]
    for layer in range(arch.num_layers):
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        attn = src + "attention."
        weights.append(NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")))
        if layer in g.layers:
            p = dst + "kda."
            weights += [
                NamedWeight(p + "in_proj.weight", fused(take, [attn + f"{name}_proj.weight" for name in "qkvb"])),
                NamedWeight(p + "conv.weight", conv_weight(
                    fused(take, [attn + f"{name}_conv1d.weight" for name in "qkv"]), attn + "{q,k,v}_conv1d.weight",
                    g.conv_dim, g.conv_kernel)),
                NamedWeight(p + "conv.bias", torch.zeros(g.conv_dim, dtype=arch.torch_dtype)),
                NamedWeight(p + "f.weight", take(attn + "f_proj.weight")),
                NamedWeight(p + "dt_bias", exact(attn + "dt_bias")),
                NamedWeight(p + "A", -torch.exp(exact(attn + "A_log").reshape(g.num_heads))),
                NamedWeight(p + "g.weight", take(attn + "g_proj.weight")),
                NamedWeight(p + "norm", take(attn + "o_norm.weight")),
                NamedWeight(p + "out.weight", take(attn + "dense.weight"))]
        else:
            if arch.latent.q_lora_rank:
                weights += [NamedWeight(dst + "q_a.weight", take(attn + "q_a_proj.weight")),
                            NamedWeight(dst + "q_a_norm", take(attn + "q_a_layernorm.weight")),
                            NamedWeight(dst + "q_b.weight", heads.queries(take(attn + "q_b_proj.weight")))]
            else:
                weights.append(NamedWeight(dst + "q.weight", heads.queries(take(attn + "q_proj.weight"))))
            weights += [NamedWeight(dst + "kv_a.weight", heads.compressed(take(attn + "kv_a_proj_with_mqa.weight"))),
                        NamedWeight(dst + "kv_a_norm", take(attn + "kv_a_layernorm.weight")),
                        NamedWeight(dst + "kv_b.weight", take(attn + "kv_b_proj.weight")),
                        NamedWeight(dst + "head_gate.weight", take(attn + "g_proj.weight")),
                        NamedWeight(dst + "o.weight", take(attn + "dense.weight"))]
        weights.append(NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")))
        if arch.is_sparse(layer):
            weights += sparse_weights(arch, layer, take, tensors, _EXPERTS)
        else:
            weights += llama.dense_mlp_weights(arch, layer, take)
    weights.append(NamedWeight("final_norm", take("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    theta = rope_theta(config)
    exponents = torch.arange(0, arch.head_dim, 2, dtype=torch.int64).to(torch.float32) / arch.head_dim
    weights.append(NamedWeight("rope.inv_freq", 1.0 / (theta ** exponents)))
    return tuple(weights), used

"""Recipe for GptOssForCausalLM (gpt-oss) checkpoints in their unquantised Hugging Face layout.

What the family adds to the Llama-style decoder, as transformers' GptOss model computes it:
- attention sinks: ``self_attn.sinks`` [Hq], one learned logit per head in every softmax denominator
  (prepared as float32 ``layers.i.sinks``);
- ``layer_types``: sliding-window and full-attention layers alternate (``sliding_window`` tokens);
- q/k/v/o biases;
- YaRN rope (`helios.ignition.recipes.yarn`; its attention factor scales the rotary cos/sin);
- a mixture-of-experts MLP in every layer: a linear router with bias, the top_k logits softmaxed
  (``helios::moe_route`` scoring "topk_softmax"), experts with biases and the clamped SwiGLU
  (``helios::moe_experts`` activation "swiglu_clamped": gate clamped above at ``swiglu_limit``, up
  clamped to +-limit, (up + 1) * gate * sigmoid(``swiglu_alpha`` * gate)).

Checkpoint expert layout: ``mlp.experts.gate_up_proj`` [E, H, 2F] multiplies from the right
(x @ W) with gate and up columns interleaved (gate = [..., ::2], up = [..., 1::2]);
``down_proj`` [E, F, H]; biases [E, 2F] (interleaved) and [E, H]. They are de-interleaved and
transposed into the ``nn.Linear`` layout the expert op takes (gate rows, then up rows).
MXFP4-quantised checkpoints (``*_blocks`` / ``*_scales`` tensors) are refused: the tensors this
recipe does not place are named in the error.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.llama import (_checkpoint_dtype, attention_block_weights, check_declared_biases,
                                           checked_rope, layer_windows, rope_settings, rotary_fraction,
                                           with_original_context)
from helios.ignition.recipes.yarn import yarn_inv_freq

ARCHITECTURES = ("GptOssForCausalLM",)
_ROPE_TYPES = ("default", "yarn")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    inv_freq, attention_factor = rope(config)
    arch = architecture_from_config(source, config, tensors, dtype, attention_factor)
    weights, used = prepared_weights(arch, tensors, inv_freq)
    unplaced = sorted(tensors.names - used)
    if unplaced and not (arch.tie_word_embeddings and unplaced == ["lm_head.weight"]):
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def architecture_from_config(source, config, tensors: CheckpointTensors, dtype: str | None,
                             attention_factor: float) -> Architecture:
    check_declared_biases(source, config, tensors)  # the q/k/v and o biases: those the tensors hold
    num_heads, num_layers = int(config["num_attention_heads"]), int(config["num_hidden_layers"])
    layer_types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]  # the config's default
    experts = MixtureOfExperts(
        num_experts=int(config["num_local_experts"]), experts_per_token=int(config["num_experts_per_tok"]),
        expert_intermediate_size=int(config["intermediate_size"]), sparse_layers=tuple(range(num_layers)),
        scoring="topk_softmax", normalize=False, router_bias=True, expert_bias=True, activation="swiglu_clamped",
        alpha=float(config.get("swiglu_alpha", 1.702)), limit=float(config.get("swiglu_limit", 7.0)),
    )
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
        intermediate_size=0, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // num_heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        layer_windows=layer_windows(source, {**config, "layer_types": layer_types}, num_layers),
        qkv_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
        o_bias="model.layers.0.self_attn.o_proj.bias" in tensors,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or _checkpoint_dtype(config, tensors), attention_sinks=True,
        rotary_factor=attention_factor, moe=experts,
    )


def rope(config: Mapping[str, Any]) -> tuple[torch.Tensor, float]:
    """(float32 inverse frequencies, attention factor) as GptOss's rotary embedding computes them."""
    params = rope_settings(config)
    if not params:
        raise UnsupportedCheckpoint("a gpt-oss config.json without rope_scaling (or rope_parameters) is refused: "
                                    "transformers 5 reads YaRN factor 32 over 4096 positions, 4.x over "
                                    "max_position_embeddings, and for an empty rope_parameters the plain rope")
    params.setdefault("rope_theta", config.get("rope_theta", 150000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    rope_type = params["rope_type"]
    if rope_type not in _ROPE_TYPES:
        raise UnsupportedCheckpoint(f"rope_type {rope_type!r} is not one of {_ROPE_TYPES}")
    rotary_fraction(params, config, partial=False)
    checked_rope(with_original_context(params, config))
    num_heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // num_heads)
    if rope_type == "yarn":
        return yarn_inv_freq(params, head_dim, config.get("max_position_embeddings"))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim
    return 1.0 / (float(params["rope_theta"]) ** exponents), 1.0


def prepared_weights(arch: Architecture, tensors: CheckpointTensors, inv_freq: torch.Tensor):
    """The weights in program layout, and the checkpoint names they were made from."""
    used: set[str] = set()

    def take(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(dtype or arch.torch_dtype)

    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        weights += _layer_weights(arch, layer, take)
    weights.append(NamedWeight("final_norm", take("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", inv_freq.to(torch.float32)))
    return tuple(weights), used


def _layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    attn, mlp = src + "self_attn.", src + "mlp."
    out = attention_block_weights(arch, layer, take)
    out += [NamedWeight(dst + "sinks", take(attn + "sinks", torch.float32)),
            NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")),
            NamedWeight(dst + "router.weight", take(mlp + "router.weight", torch.float32)),
            NamedWeight(dst + "router.bias", take(mlp + "router.bias", torch.float32))]
    experts = mlp + "experts."
    gate_up, gate_up_bias = take(experts + "gate_up_proj"), take(experts + "gate_up_proj_bias")
    out += [
        NamedWeight(dst + "experts.gate_up",
                    torch.cat((gate_up[..., ::2], gate_up[..., 1::2]), dim=-1).transpose(1, 2).contiguous()),
        NamedWeight(dst + "experts.gate_up_bias", torch.cat((gate_up_bias[:, ::2], gate_up_bias[:, 1::2]), dim=-1)),
        NamedWeight(dst + "experts.down", take(experts + "down_proj").transpose(1, 2).contiguous()),
        NamedWeight(dst + "experts.down_bias", take(experts + "down_proj_bias")),
    ]
    return out

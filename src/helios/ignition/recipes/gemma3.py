"""Recipe for Gemma 3 text checkpoints: Gemma3ForCausalLM (transformers' Gemma3TextConfig, model_type
``gemma3_text``: Gemma 3 1B and 270M, and text-only conversions of the larger models).

The decoder is Llama's grouped-query attention with per-head q/k RMS norms (Qwen3's ``qk_norm``)
and these differences, each an `Architecture` switch:

- every RMSNorm computes ``norm(x.float()) * (1 + w.float())``: the weight is folded to ``1 + w`` at
  preparation (in float32, then the model dtype), also for q_norm / k_norm and the final norm. In
  float32 the prepared norm is the reference's bit for bit; in bfloat16 the program rounds the
  normed input and ``1 + w`` to bfloat16 before their product where the reference multiplies in
  float32 and rounds once, so results may differ in the last bit;
- sandwich norms (``sandwich_norms``): ``post_attention_layernorm`` on the attention output and
  ``post_feedforward_layernorm`` on the MLP output, each before its residual add
  (``layers.i.attn_out_norm``, ``layers.i.mlp_out_norm``); ``pre_feedforward_layernorm`` is the
  prepared ``post_norm`` (the norm before the MLP);
- the MLP's ``hidden_activation`` ``gelu_pytorch_tanh`` (``helios::gelu_tanh_mul``; no other is
  accepted);
- embeddings times sqrt(hidden_size) rounded to the model dtype (``embedding_scale``, as
  Gemma3TextScaledWordEmbedding multiplies);
- the attention scale ``query_pre_attn_scalar ** -0.5``;
- ``layer_types`` (or, in older config.json files, ``sliding_window_pattern``: every layer but each
  pattern-th slides) with the reference's window convention (a sliding query sees its last
  ``sliding_window`` positions, its own included: the prepared window); sliding layers rotate with
  the local table (``rope_local_base_freq``, default rope), full layers with ``rope_theta`` and
  ``rope_scaling`` (default or linear: 4B and larger use linear factor 8) - ``local_rope_layers``
  and the ``rope.local_inv_freq`` slot. transformers 5's nested ``rope_parameters``
  (``full_attention`` / ``sliding_attention``) are read the same way;
- ``final_logit_softcapping`` (null in Gemma 3's configs): ``tanh(logits / c) * c`` on every
  logits path (``logit_softcap``);
- tied embeddings (Gemma 3 ties; an untied checkpoint's ``lm_head`` is taken).

Refused by name: ``attn_logit_softcapping`` (transformers' Gemma3Attention stores it but never applies
it, unlike Gemma 2's; a checkpoint that sets it is ambiguous),
``use_bidirectional_attention``, another activation, malformed ``layer_types`` or pattern, a
sliding layer without a positive window, rope types other than default and linear.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Gemma3ForCausalLM",)
LAYER_TYPES = llama.LAYER_TYPES
ROPE_TYPES = ("default", "linear")
ACTIVATION = "gelu_pytorch_tanh"


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    llama.check_declared_biases(source, config, tensors)  # gemma_fields reads the biases the tensors hold
    arch = architecture_from_config(config, tensors, dtype)
    full, local = rope_tables(config, arch.head_dim)
    weights, used = llama.prepared_weights(arch, config, tensors, _layer_weights, full, transform=_folded_norm)
    if arch.local_rope_layers:  # (every layer full: one table)
        weights += (NamedWeight("rope.local_inv_freq", local),)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def architecture_from_config(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Architecture:
    _refuse_unsupported(config)
    num_layers = int(config["num_hidden_layers"])
    kinds = layer_types(config, num_layers)
    window = config.get("sliding_window")
    if "sliding_attention" in kinds and not (isinstance(window, int) and window > 0):
        raise UnsupportedCheckpoint(f"config.json: sliding_window {window!r} must be a positive count for the "
                                    f"sliding_attention layers")
    for key in ("head_dim", "intermediate_size", "rms_norm_eps", "query_pre_attn_scalar"):
        if config[key] is None:  # the reference computes with them: a null breaks it
            raise UnsupportedCheckpoint(f"config.json: {key} must be a number, got null")
    scalar = config["query_pre_attn_scalar"]
    if not scalar > 0:  # its inverse square root scales the attention
        raise UnsupportedCheckpoint(f"config.json: query_pre_attn_scalar must be positive, got {scalar!r}")
    return Architecture(
        **gemma_fields(config, tensors, dtype),
        layer_windows=tuple(int(window) if kind == "sliding_attention" else 0 for kind in kinds),
        qk_norm=True,
        sandwich_norms=True,
        query_pre_attn_scalar=float(scalar),
        local_rope_layers=tuple(layer for layer, kind in enumerate(kinds) if kind == "sliding_attention"),
        logit_softcap=_logit_softcap(config),
    )


def gemma_fields(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> dict[str, Any]:
    """The `Architecture` fields every Gemma generation reads alike (on a config whose head_dim,
    intermediate_size and rms_norm_eps are not null): the geometry, the q/o biases the checkpoint
    holds, tied embeddings unless untied, the dtype, the gelu-tanh MLP and the scaled embeddings."""
    num_heads = int(config["num_attention_heads"])
    dtype = dtype or llama._checkpoint_dtype(config, tensors)
    prefix = "model.layers.0.self_attn."
    return dict(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config["head_dim"]),
        rms_norm_eps=float(config["rms_norm_eps"]),
        qkv_bias=prefix + "q_proj.bias" in tensors,
        o_bias=prefix + "o_proj.bias" in tensors,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        dtype=dtype,
        mlp_activation="gelu_tanh",
        embedding_scale=embedding_scale(int(config["hidden_size"]), dtype),
    )


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    if config.get("hidden_activation") != ACTIVATION:
        raise UnsupportedCheckpoint(f"hidden_activation {config.get('hidden_activation')!r} is not supported "
                                    f"(only {ACTIVATION!r})")
    if config.get("attn_logit_softcapping") is not None:
        raise UnsupportedCheckpoint(f"attn_logit_softcapping {config['attn_logit_softcapping']!r} is not supported "
                                    f"(transformers' Gemma 3 attention ignores it; Gemma 2's applies it)")
    if config.get("use_bidirectional_attention"):
        raise UnsupportedCheckpoint("use_bidirectional_attention is not supported (the programs attend causally)")


def _logit_softcap(config: Mapping[str, Any]) -> float:
    cap = config.get("final_logit_softcapping")
    if cap is None:
        return 0.0
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise UnsupportedCheckpoint(f"config.json: final_logit_softcapping must be a positive number or null, "
                                    f"got {cap!r}")
    return float(cap)


def layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, as Gemma3TextConfig resolves it: ``layer_types``, else every layer
    but each ``sliding_window_pattern``-th slides."""
    kinds = config.get("layer_types")
    if kinds is None:
        pattern = config.get("sliding_window_pattern")
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise UnsupportedCheckpoint(f"config.json: sliding_window_pattern must be a positive count, "
                                        f"got {pattern!r}")
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers))
    return llama.listed_layer_types(kinds, num_layers)


def embedding_scale(hidden_size: int, dtype: str) -> float:
    """sqrt(hidden_size) as the reference multiplies by it: a float32 tensor cast to the model dtype
    (bfloat16: sqrt(3072) = 55.4256 becomes 55.5)."""
    return float(torch.tensor(hidden_size**0.5).to(getattr(torch, dtype)))


def rope_tables(config: Mapping[str, Any], head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 inverse frequencies [head_dim / 2] of the full layers, then of the sliding layers."""
    full, local = llama.layer_kind_rope(config, config.get("rope_theta"), config.get("rope_local_base_freq"))
    return _inv_freq(full, "full_attention", head_dim), _inv_freq(local, "sliding_attention", head_dim)


def _inv_freq(table: dict[str, Any], kind: str, head_dim: int) -> torch.Tensor:
    rope_type = table.setdefault("rope_type", table.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedCheckpoint(f"config.json: the {kind} layers' rope_type {rope_type!r} is not one of "
                                    f"{ROPE_TYPES}")
    theta = table.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        key = "rope_local_base_freq" if kind == "sliding_attention" else "rope_theta"
        raise UnsupportedCheckpoint(f"config.json: the {kind} layers' rope_theta ({key}) must be positive, "
                                    f"got {theta!r}")
    return llama.rope_inv_freq({"rope_parameters": table}, head_dim)


def _folded_norm(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm weights w as the ``1 + w`` the reference multiplies by (float32, then the
    model dtype); every other tensor as it is."""
    if name.endswith("norm.weight"):
        return (1.0 + tensor.to(torch.float32)).to(tensor.dtype)
    return tensor


def _layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    # Llama's slots end with post_attention_layernorm as the norm before the MLP; here it norms the
    # attention output, and pre_feedforward_layernorm is the norm before the MLP.
    *attention, attention_out = llama.attention_weights(arch, layer, take)
    return attention + [
        NamedWeight(dst + "attn_out_norm", attention_out.tensor),
        NamedWeight(dst + "post_norm", take(src + "pre_feedforward_layernorm.weight")),
        *llama.dense_mlp_weights(arch, layer, take),
        NamedWeight(dst + "mlp_out_norm", take(src + "post_feedforward_layernorm.weight")),
    ]

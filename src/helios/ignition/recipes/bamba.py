"""Recipe for hybrid Mamba2 + attention checkpoints: `BambaForCausalLM`.

Layers listed in ``attn_layer_indices`` are attention layers (grouped-query, rotary on the leading
``partial_rotary_factor`` of each head); every other layer is a Mamba2 mixer whose convolution and
SSM state live in state rows (`helios.ignition.recurrent_geometry`). Every layer has a pre-norm
(``input_layernorm``), a post-norm (``pre_ff_layernorm``) and a gated SiLU MLP (``feed_forward``).
Prepared layout: q/k/v and gate/up fused, the depthwise convolution as [conv_dim, kernel], A as
-exp(A_log) in float32, rotary frequencies computed once.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, conv_weight, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recurrent_geometry import RecurrentGeometry

ARCHITECTURES = ("BambaForCausalLM",)
_DTYPES = ("float32", "bfloat16", "float16")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    # BambaConfig sets a top-level partial_rotary_factor to 0.5 whatever config.json says ("for BC"):
    # only the rope dict's own factor counts, as here.
    config = {**config, "partial_rotary_factor": 0.5}
    arch = architecture_from_config(config, tensors, dtype)
    weights, used = prepared_weights(arch, config, tensors)
    unplaced = sorted(tensors.names - used)
    if unplaced and not (arch.tie_word_embeddings and unplaced == ["lm_head.weight"]):
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def architecture_from_config(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    hidden, num_layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    num_heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // num_heads)
    rope = llama.rope_parameters(config, partial=True)  # either layout (`build` sets the top-level factor)
    if rope["rope_type"] != "default":
        raise UnsupportedCheckpoint(f"rope_type {rope['rope_type']!r} is not supported (only 'default')")
    attention = set(config.get("attn_layer_indices") or ())
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden, intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads), head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)), layer_windows=(0,) * num_layers,
        qkv_bias=bool(config.get("attention_bias", False)), o_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or checkpoint_dtype(config, tensors),
        recurrent=mamba2_geometry(config, hidden, tuple(i for i in range(num_layers) if i not in attention)),
        rotary_dim=llama.rotary_width(config, head_dim),
    )


def mamba2_geometry(config: Mapping[str, Any], hidden: int, layers: tuple[int, ...],
                    intermediate: int | None = None) -> RecurrentGeometry:
    """The Mamba2 mixers of `layers` from the ``mamba_*`` keys (Bamba's, Granite 4's and Falcon-H1's
    spelling), `intermediate` wide (None: ``mamba_expand`` x hidden)."""
    heads = int(config.get("mamba_n_heads", 128))
    width = intermediate or int(config.get("mamba_expand", 2)) * hidden
    head_dim = config.get("mamba_d_head", "auto")
    head_dim = width // heads if head_dim in (None, "auto") else int(head_dim)
    if heads * head_dim != width:
        raise UnsupportedCheckpoint(f"mamba heads {heads} x {head_dim} != the mixer width {width} (mamba_expand x "
                                    f"hidden_size, or mamba_d_ssm)")
    limit = config.get("time_step_limit") or (0.0, math.inf)
    return RecurrentGeometry(
        layers=layers, num_heads=heads, head_dim=head_dim, state_size=int(config.get("mamba_d_state", 256)),
        num_groups=int(config.get("mamba_n_groups", 1)), conv_kernel=int(config.get("mamba_d_conv", 4)),
        proj_bias=bool(config.get("mamba_proj_bias", False)), out_bias=bool(config.get("mamba_proj_bias", False)),
        dt_limit=(config_float(limit[0]), config_float(limit[1])),
    )


def config_float(value: Any) -> float:
    """A config float; JSON writers spell infinity as {"__float__": "Infinity"}."""
    if isinstance(value, Mapping):
        value = value.get("__float__")
    return float(value)


def rope_inv_freq(config: Mapping[str, Any], rotary_dim: int) -> torch.Tensor:
    theta = float(llama.rope_parameters(config, partial=True)["rope_theta"])
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def prepared_weights(arch: Architecture, config, tensors: CheckpointTensors, transform=None):
    """The weights in program layout and the checkpoint names they came from; `transform` (name,
    tensor) -> tensor rewrites checkpoint tensors (Falcon-H1's folded multipliers)."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        tensor = tensors.get(name).to(arch.torch_dtype)
        return transform(name, tensor) if transform else tensor

    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        weights += _layer_weights(arch, layer, take, tensors, used)
    weights.append(NamedWeight("final_norm", take("model.final_layernorm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", rope_inv_freq(config, arch.rotary_width)))
    return tuple(weights), used


def _layer_weights(arch: Architecture, layer: int, take, tensors: CheckpointTensors, used: set) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    out = [NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight"))]
    if layer in arch.attention_layers:  # both, attention first, under arch.parallel_mixer (Falcon-H1)
        out += attention_weights(arch, src + "self_attn.", dst, take)
    if layer in arch.recurrent.layers:
        out += mixer_weights(arch, src + "mamba.", dst + "mixer.", take, tensors, used)
    mlp = src + "feed_forward."
    out += [NamedWeight(dst + "post_norm", take(src + "pre_ff_layernorm.weight")),
            NamedWeight(dst + "gate_up.weight", fused(take, [mlp + "gate_proj.weight", mlp + "up_proj.weight"]))]
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "gate_up.bias", fused(take, [mlp + "gate_proj.bias", mlp + "up_proj.bias"])))
    out.append(NamedWeight(dst + "down.weight", take(mlp + "down_proj.weight")))
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "down.bias", take(mlp + "down_proj.bias")))
    return out


def attention_weights(arch: Architecture, src: str, dst: str, take) -> list[NamedWeight]:
    """An attention block's slots from the checkpoint's ``src`` q/k/v/o projections."""
    names = [src + "q_proj.", src + "k_proj.", src + "v_proj."]
    out = [NamedWeight(dst + "qkv.weight", fused(take, [n + "weight" for n in names]))]
    if arch.qkv_bias:
        out.append(NamedWeight(dst + "qkv.bias", fused(take, [n + "bias" for n in names])))
    out.append(NamedWeight(dst + "o.weight", take(src + "o_proj.weight")))
    if arch.o_bias:
        out.append(NamedWeight(dst + "o.bias", take(src + "o_proj.bias")))
    return out


def mixer_weights(arch: Architecture, src: str, dst: str, take, tensors, used: set) -> list[NamedWeight]:
    """A Mamba2 mixer's slots from the checkpoint's ``src`` tensors (A_log read apart, into `used`)."""
    g = arch.recurrent
    out = [NamedWeight(dst + "in_proj.weight", take(src + "in_proj.weight"))]
    if g.proj_bias:
        out.append(NamedWeight(dst + "in_proj.bias", take(src + "in_proj.bias")))
    conv_bias = take(src + "conv1d.bias") if src + "conv1d.bias" in tensors else torch.zeros(
        g.conv_dim, dtype=arch.torch_dtype)
    used.add(src + "A_log")
    a = -torch.exp(tensors.get(src + "A_log").to(torch.float32))
    out += [NamedWeight(dst + "conv.weight", conv_weight(take(src + "conv1d.weight"), src + "conv1d.weight",
                                                       g.conv_dim, g.conv_kernel)),
            NamedWeight(dst + "conv.bias", conv_bias), NamedWeight(dst + "dt_bias", take(src + "dt_bias")),
            NamedWeight(dst + "A", a), NamedWeight(dst + "D", take(src + "D"))]
    if g.gated_norm:
        out.append(NamedWeight(dst + "norm", take(src + "norm.weight")))
    out.append(NamedWeight(dst + "out.weight", take(src + "out_proj.weight")))
    if g.out_bias:
        out.append(NamedWeight(dst + "out.bias", take(src + "out_proj.bias")))
    return out


def checkpoint_dtype(config: Mapping[str, Any], tensors: CheckpointTensors) -> str:
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared in _DTYPES:
        return declared
    return str(tensors.get("model.embed_tokens.weight").dtype).removeprefix("torch.")

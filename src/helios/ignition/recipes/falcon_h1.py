"""Recipe for Falcon-H1 checkpoints (FalconH1ForCausalLM).

Every layer holds a Mamba2 mixer and grouped-query rotary attention side by side
(`Architecture.parallel_mixer`): both read the input norm's output and their outputs are added to
the residual; then ``pre_ff_layernorm`` and a gated SiLU MLP. Bamba's tensor names
(`helios.ignition.recipes.bamba`); the mixer's width is ``mamba_d_ssm`` (``mamba_expand`` x hidden
where null), and without ``mamba_rms_norm`` its scan output is gated, not normed
(`RecurrentGeometry.gated_norm`).

Falcon-H1's muP multipliers are folded into the weights (each scales a linear map's input or
output): ``attention_in_multiplier`` into the q/k/v weights (not their biases: it scales the
attention's input), ``key_multiplier`` into the k rows and bias, ``attention_out_multiplier`` into
o, ``ssm_in_multiplier`` into in_proj's weight, ``ssm_multipliers`` (z, x, B, C, dt) into in_proj's
row segments and bias, ``ssm_out_multiplier`` into out_proj, ``mlp_multipliers`` (gate, down) into
the gate rows and the down projection, ``lm_head_multiplier`` into the final norm (the head is
linear in it, tied or not); ``embedding_multiplier`` is `Architecture.embedding_scale`.

Refused by name: a gated norm applied before the gate (``mamba_norm_before_gate`` with
``mamba_rms_norm``), a partial rotary factor, rope types other than the default, other
activations, mixer heads that do not tile the mixer width, multiplier lists of other lengths.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import bamba, llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("FalconH1ForCausalLM",)
_SCALARS = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
            "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")
_LISTS = {"mlp_multipliers": 2, "ssm_multipliers": 5}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    multipliers = read_multipliers(config)
    arch = architecture_from_config(config, tensors, dtype, multipliers["embedding_multiplier"])
    weights, used = bamba.prepared_weights(arch, config, tensors, transform=folded(arch, multipliers))
    recipe = llama.placed_recipe(source, arch, weights, used, tensors)
    return dataclasses.replace(recipe, inputs_embeds_scale=multipliers["embedding_multiplier"])


def read_multipliers(config: Mapping[str, Any]) -> dict[str, Any]:
    """The muP multipliers (1.0 where missing or null), each a finite number; the embedding one positive."""
    values: dict[str, Any] = {}
    for key in (*_SCALARS, *_LISTS):
        value = config.get(key)
        if value is None:
            value = [1.0] * _LISTS[key] if key in _LISTS else 1.0
        if key in _LISTS and (not isinstance(value, list) or len(value) != _LISTS[key]):
            raise UnsupportedCheckpoint(f"config.json: {key} must list {_LISTS[key]} numbers, got {value!r:.80}")
        numbers = value if key in _LISTS else [value]
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) for n in numbers):
            raise UnsupportedCheckpoint(f"config.json: {key} must be finite numbers, got {value!r:.80}")
        values[key] = [float(n) for n in numbers] if key in _LISTS else float(value)
    if values["embedding_multiplier"] <= 0:
        raise UnsupportedCheckpoint(f"config.json: embedding_multiplier {values['embedding_multiplier']} is not "
                                    f"supported (only positive values)")
    return values


def architecture_from_config(config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None,
                             embedding_scale: float) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    if config.get("mamba_rms_norm") and config.get("mamba_norm_before_gate"):
        raise UnsupportedCheckpoint("config.json: mamba_norm_before_gate true with mamba_rms_norm is not supported "
                                    "(only the norm of the gated scan output)")
    rope = llama.rope_parameters(config)  # refuses a partial rotary factor: the reference rotates whole heads
    if rope["rope_type"] != "default":
        raise UnsupportedCheckpoint(f"rope_type {rope['rope_type']!r} is not supported (only 'default')")
    if "head_dim" in config and config["head_dim"] is None:
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the reference cannot size heads by")
    hidden, num_layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    num_heads = int(config["num_attention_heads"])
    width = config.get("mamba_d_ssm")
    geometry = bamba.mamba2_geometry(config, hidden, tuple(range(num_layers)), None if width is None else int(width))
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden, intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads), rms_norm_eps=float(config["rms_norm_eps"]),
        layer_windows=(0,) * num_layers, qkv_bias=bool(config.get("attention_bias", False)),
        o_bias=bool(config.get("attention_bias", False)), mlp_bias=bool(config.get("mlp_bias", False)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or bamba.checkpoint_dtype(config, tensors), embedding_scale=embedding_scale, parallel_mixer=True,
        recurrent=dataclasses.replace(geometry, out_bias=bool(config.get("projectors_bias", False)),
                                      gated_norm=bool(config.get("mamba_rms_norm", False))),
    )


def folded(arch: Architecture, multipliers: Mapping[str, Any]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The weight transform that folds the multipliers (module docstring) into checkpoint tensors."""
    g = arch.recurrent
    attention_in, key = multipliers["attention_in_multiplier"], multipliers["key_multiplier"]
    gate, down = multipliers["mlp_multipliers"]
    segments = (g.intermediate, g.intermediate, g.num_groups * g.state_size, g.num_groups * g.state_size, g.num_heads)
    mup = torch.cat([torch.full((width,), value) for width, value in zip(segments, multipliers["ssm_multipliers"])])
    scales = {"self_attn.q_proj.weight": attention_in, "self_attn.v_proj.weight": attention_in,
              "self_attn.k_proj.weight": attention_in * key, "self_attn.k_proj.bias": key,
              "self_attn.o_proj.weight": multipliers["attention_out_multiplier"],
              "self_attn.o_proj.bias": multipliers["attention_out_multiplier"],
              "mamba.out_proj.weight": multipliers["ssm_out_multiplier"],
              "mamba.out_proj.bias": multipliers["ssm_out_multiplier"],
              "feed_forward.gate_proj.weight": gate, "feed_forward.gate_proj.bias": gate,
              "feed_forward.down_proj.weight": down, "feed_forward.down_proj.bias": down}

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name == "model.final_layernorm.weight":
            return tensor * multipliers["lm_head_multiplier"]
        key_name = name.split(".", 3)[-1] if name.startswith("model.layers.") else name
        if key_name == "mamba.in_proj.weight":
            return tensor * (mup * multipliers["ssm_in_multiplier"]).to(tensor.dtype)[:, None]
        if key_name == "mamba.in_proj.bias":
            return tensor * mup.to(tensor.dtype)
        scale = scales.get(key_name, 1.0)
        return tensor if scale == 1.0 else tensor * scale

    return transform

"""Recipe for DBRX checkpoints (DbrxForCausalLM: DBRX Base / Instruct).

Read as DbrxConfig and DbrxModel read them (the nested ``attn_config`` and ``ffn_config``):

- pre-norm layers whose norms are LayerNorms without a bias (``norm_1``, ``norm_2``, ``norm_f``; epsilon
  1e-5, nn.LayerNorm's): `Architecture.layer_norm`;
- attention with a fused ``Wqkv`` projection (q, k, v rows: the program's own layout), ``kv_n_heads``
  key/value heads, head_dim ``d_model`` / ``n_heads``, no biases, every output clamped to
  [-``clip_qkv``, ``clip_qkv``] (`Architecture.qkv_clip`), rotary embeddings on whole heads
  by the top-level rope settings (the llama recipe's types);
- a mixture of experts in every layer: a softmax over ``moe_num_experts`` router logits, the top
  ``moe_top_k`` divided by their sum (``moe_normalize_expert_weights`` 1, the p = 1 norm of positive
  weights; null: not renormalised), experts stored as three [E F, H] matrices ``w1`` (gate), ``v1``
  (up) and ``w2`` (the down projection transposed).

Refused by name: another ``ffn_act_fn`` than silu, another normalisation power, tied embeddings (the
reference refuses them), a null ``clip_qkv`` (DbrxConfig's default, with which the reference's
attention fails: it clamps with neither bound), and an ``attn_config.rope_theta`` other than the theta
transformers 5 rotates by (it reads the top-level rope settings and ignores the nested key, which
DBRX's own code read): the two would disagree, so neither is chosen silently.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, shaped
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("DbrxForCausalLM",)
_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which DbrxNormAttentionNorm and norm_f keep
# DbrxConfig's (and its sub-configs') defaults for the keys this recipe reads.
_DEFAULTS = {"d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048, "vocab_size": 32000}
_ATTN_DEFAULTS = {"kv_n_heads": 1, "clip_qkv": None}
_FFN_DEFAULTS = {"ffn_hidden_size": 3584, "moe_num_experts": 4, "moe_top_k": 1, "moe_normalize_expert_weights": 1.0,
                 "ffn_act_fn": {"name": "silu"}}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    attn = {**_ATTN_DEFAULTS, **(config.get("attn_config") or {})}
    ffn = {**_FFN_DEFAULTS, **(config.get("ffn_config") or {})}
    _refuse_unsupported(config, attn, ffn)
    hidden, heads = int(config["d_model"]), int(config["n_heads"])
    if hidden % heads:
        raise UnsupportedCheckpoint(f"config.json: d_model {hidden} is not a multiple of n_heads {heads}")
    experts = MixtureOfExperts(int(ffn["moe_num_experts"]), int(ffn["moe_top_k"]), int(ffn["ffn_hidden_size"]),
                               tuple(range(int(config["n_layers"]))),
                               normalize=ffn["moe_normalize_expert_weights"] is not None)
    rope = {**config, "max_position_embeddings": config["max_seq_len"]}
    arch = Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden, intermediate_size=0,
        num_layers=int(config["n_layers"]), num_heads=heads, num_kv_heads=int(attn["kv_n_heads"]),
        head_dim=hidden // heads, rms_norm_eps=_LAYER_NORM_EPS, layer_windows=(0,) * int(config["n_layers"]),
        dtype=dtype or llama._checkpoint_dtype(config, tensors, "transformer.wte.weight"), moe=experts, layer_norm=True,
        rotary_factor=llama.rope_attention_factor(rope), qkv_clip=float(attn["clip_qkv"]))
    llama.rope_parameters(rope)  # the rope type and a partial factor checked (whole heads)
    weights, used = _prepared_weights(arch, tensors, llama.rope_inv_freq(rope, arch.head_dim))
    unplaced = sorted(tensors.names - used)
    if unplaced:
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def _refuse_unsupported(config: Mapping[str, Any], attn: Mapping[str, Any], ffn: Mapping[str, Any]) -> None:
    activation = ffn["ffn_act_fn"]
    if activation != {"name": "silu"}:
        raise UnsupportedCheckpoint(f"config.json: ffn_config.ffn_act_fn {activation!r} is not supported (only "
                                    f"{{'name': 'silu'}})")
    power = ffn["moe_normalize_expert_weights"]
    if power is not None and power != 1:
        raise UnsupportedCheckpoint(f"config.json: ffn_config.moe_normalize_expert_weights {power!r} is not "
                                    f"supported (1: weights divided by their sum, or null)")
    if config.get("tie_word_embeddings"):
        raise UnsupportedCheckpoint("config.json: tie_word_embeddings true is not supported (the reference refuses "
                                    "tied DBRX embeddings)")
    clip = attn["clip_qkv"]
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0:
        raise UnsupportedCheckpoint(f"config.json: attn_config.clip_qkv {clip!r} must be a positive number (null: the "
                                    f"reference's clamp of neither bound fails)")
    nested = attn.get("rope_theta")
    theta = llama.rope_parameters(config)["rope_theta"]
    if nested is not None and float(nested) != float(theta):
        raise UnsupportedCheckpoint(f"config.json: attn_config.rope_theta {nested} differs from the rope_theta "
                                    f"{theta} transformers rotates by (it ignores the nested key)")


def _prepared_weights(arch: Architecture, tensors: CheckpointTensors, inv_freq: torch.Tensor):
    """The weights in program layout, and the checkpoint names they were made from."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    experts, width, hidden = arch.moe.num_experts, arch.moe.expert_intermediate_size, arch.hidden_size
    weights = [NamedWeight("embed", take("transformer.wte.weight"))]
    for layer in range(arch.num_layers):
        src, dst = f"transformer.blocks.{layer}.", f"layers.{layer}."
        block, mlp = src + "norm_attn_norm.", src + "ffn.experts.mlp."
        gate, up, down = (shaped(take(mlp + name), mlp + name, (experts * width, hidden))
                          .reshape(experts, width, hidden) for name in ("w1", "v1", "w2"))
        down = down.transpose(1, 2).contiguous()
        weights += [NamedWeight(dst + "input_norm", take(block + "norm_1.weight")),
                    NamedWeight(dst + "qkv.weight", take(block + "attn.Wqkv.weight")),
                    NamedWeight(dst + "o.weight", take(block + "attn.out_proj.weight")),
                    NamedWeight(dst + "post_norm", take(block + "norm_2.weight")),
                    NamedWeight(dst + "router.weight", take(src + "ffn.router.layer.weight").float()),
                    NamedWeight(dst + "experts.gate_up", torch.cat((gate, up), dim=1).contiguous()),
                    NamedWeight(dst + "experts.down", down)]
    weights += [NamedWeight("final_norm", take("transformer.norm_f.weight")),
                NamedWeight("lm_head", take("lm_head.weight")), NamedWeight("rope.inv_freq", inv_freq)]
    return tuple(weights), used


"""Recipe for DeepSeek-V3 checkpoints (DeepseekV3ForCausalLM), GLM-4.7-Flash's (Glm4MoeLiteForCausalLM)
and Youtu-LLM's (YoutuForCausalLM), the same dataflow: multi-head latent attention.

Family knowledge turned into Architecture fields and the prepared weight layout:

* latent attention (`LatentAttention`): the query through a low-rank pair with its own norm
  (``q_lora_rank``) or one projection (``q_lora_rank`` null); keys/values compressed to
  ``kv_lora_rank`` plus one shared rotary key; the q/kv latent norms use epsilon 1e-6 as the
  reference does (not ``rms_norm_eps``);
* rope: "default" or "yarn" (inverse frequencies, the attention factor that scales cos/sin, and
  DeepSeek's softmax scale ``qk_head_dim ** -0.5 * mscale(factor, mscale_all_dim) ** 2``, exactly as
  transformers' DeepseekV3 computes them); with ``rope_interleave`` the rotary rows of the query and
  rotary-key projections are de-interleaved here, so programs rotate halves (the same values);
* dense first layers (``first_k_dense_replace``) with the gated MLP of ``intermediate_size``, then
  mixture-of-experts layers (`MixtureOfExperts`, read as `helios.ignition.recipes.moe` reads them): sigmoid scoring with the router's correction bias
  (``e_score_correction_bias``), group-limited top-k (``n_group``, ``topk_group``), ``norm_topk_prob``,
  ``routed_scaling_factor`` and ``n_shared_experts`` shared experts of ``moe_intermediate_size`` each
  (for none, transformers saves zero-width shared-expert tensors, which are skipped).

GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is DeepSeek-V3's dataflow under GLM's names: its sparse layers
are those ``mlp_layer_types`` marks "sparse" (by default every layer but the first, as Glm4MoeLiteConfig
fills it in). Its reference never reads ``first_k_dense_replace``, nor does this recipe: a config.json
whose ``first_k_dense_replace`` disagrees with the layer types prepares the model transformers loads.

Youtu-LLM (YoutuForCausalLM) is DeepSeek-V3's latent attention with the gated MLP in every layer (no
experts; embeddings tied by default, as YoutuConfig has it).

A checkpoint tensor this recipe does not place is an error (multi-token-prediction layers past
``num_hidden_layers`` are not served and are skipped, as transformers skips them). The functions
`latent_architecture` and `latent_recipe` serve DeepSeek-V2 too (`helios.ignition.recipes.deepseek_v2`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, LatentAttention, MixtureOfExperts
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.llama import (_checkpoint_dtype, checked_rope, rope_settings, rotary_fraction,
                                           with_original_context)
from helios.ignition.recipes.moe import ExpertNames, is_empty_shared_expert, mixture_from_config, sparse_weights
from helios.ignition.recipes.yarn import nonzero_frequencies

ARCHITECTURES = ("DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM", "YoutuForCausalLM")
_LAYER_KINDS = ("dense", "sparse")  # Glm4MoeLiteConfig.mlp_layer_types
ROPE_TYPES = ("default", "yarn")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_EXPERT_NAMES = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if source == "Glm4MoeLiteForCausalLM":
        check_key_heads(config)
        arch = latent_architecture(source, config, tensors, dtype, lite_experts(source, config))
    elif source == "YoutuForCausalLM":
        check_key_heads(config)
        arch = latent_architecture(source, config, tensors, dtype, None)
    else:
        arch = architecture_from_config(source, config, tensors, dtype)
    return latent_recipe(source, arch, config, tensors, bool(config.get("rope_interleave", True)))


def latent_recipe(source: str, arch: Architecture, config: Mapping[str, Any], tensors: CheckpointTensors,
                  interleaved: bool, attention_extra=None) -> Recipe:
    """The recipe of a latent-attention `arch` (rotary rows interleaved in the checkpoint or not);
    refuses a checkpoint with tensors it does not place. `attention_extra(layer, take)`, if given,
    returns a layer's weights that follow ``o.weight`` (DeepSeek-V3.2's indexer)."""
    weights, used = prepared_weights(arch, config, tensors, interleaved, attention_extra)
    unplaced = sorted(name for name in tensors.names - used
                      if not name.endswith(_IGNORED_SUFFIXES) and not _is_extra_layer(name, arch.num_layers)
                      and not is_empty_shared_expert(name, arch, tensors))
    if unplaced and not (arch.tie_word_embeddings and unplaced == ["lm_head.weight"]):
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def architecture_from_config(source: str, config: Mapping[str, Any], tensors: CheckpointTensors,
                             dtype: str | None) -> Architecture:
    return latent_architecture(source, config, tensors, dtype,
                               experts(source, config, int(config["num_hidden_layers"])))


def latent_architecture(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None,
                        moe: MixtureOfExperts | None) -> Architecture:
    """The latent-attention decoder the config declares, with the family's `moe` layers."""
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    if config.get("attention_bias"):
        raise UnsupportedCheckpoint(f"{source} attention_bias is not supported")
    num_layers, num_heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    rope_dim = int(config["qk_rope_head_dim"])
    params = rope_parameters(config)
    _, attention_factor = rope_inv_freq(config, rope_dim)
    latent = LatentAttention(
        kv_lora_rank=int(config["kv_lora_rank"]), qk_nope_head_dim=int(config["qk_nope_head_dim"]),
        qk_rope_head_dim=rope_dim, v_head_dim=int(config["v_head_dim"]),
        scale=softmax_scale(params, int(config["qk_nope_head_dim"]) + rope_dim),
        q_lora_rank=int(config.get("q_lora_rank") or 0), rope_attention_factor=attention_factor,
    )
    dense = moe is None or len(moe.sparse_layers) < num_layers  # else intermediate_size sizes no layer (0)
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]) if dense else 0, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_heads, head_dim=rope_dim, rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        layer_windows=(0,) * num_layers, tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or _checkpoint_dtype(config, tensors), latent=latent, moe=moe,
    )


def check_key_heads(config: Mapping[str, Any]) -> None:
    """The references up-project one key and value head per query head; a config.json declaring
    fewer key/value heads makes their attention fail (it repeats the heads by the ratio)."""
    heads, key_heads = config["num_attention_heads"], config.get("num_key_value_heads")
    if key_heads is not None and key_heads != heads:
        raise UnsupportedCheckpoint(f"num_key_value_heads {key_heads} must equal num_attention_heads {heads} "
                                    f"under latent attention")


def lite_experts(source: str, config: Mapping[str, Any]) -> MixtureOfExperts | None:
    """GLM-4.7-Flash's mixture: DeepSeek-V3's routing on the layers ``mlp_layer_types`` marks sparse
    (``first_k_dense_replace``, which `mixture_from_config` reads for DeepSeek-V3, is not read)."""
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("mlp_layer_types")
    if kinds is None:  # Glm4MoeLiteConfig's default
        kinds = ["dense"] + ["sparse"] * (num_layers - 1)
    if not isinstance(kinds, list) or len(kinds) != num_layers or not set(kinds) <= set(_LAYER_KINDS):
        raise UnsupportedCheckpoint(f"mlp_layer_types {kinds!r:.120} must list {_LAYER_KINDS} per layer "
                                    f"({num_layers})")
    sparse = tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
    if not sparse:
        return None
    return dataclasses.replace(mixture_from_config(source, config, num_layers), sparse_layers=sparse)


def experts(source: str, config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts | None:
    """The mixture-of-experts layers (from first_k_dense_replace on; sigmoid routing with the correction
    bias, as `helios.ignition.recipes.moe` declares it for GLM-4.5), or None when every layer is dense."""
    if int(config.get("first_k_dense_replace") or 0) >= num_layers:
        return None
    return mixture_from_config(source, config, num_layers)


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    params = rope_settings(config)
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] not in ROPE_TYPES:
        raise UnsupportedCheckpoint(f"rope_type {params['rope_type']!r} is not one of {ROPE_TYPES}")
    rotary_fraction(params, config, partial=False)
    checked_rope(with_original_context(params, config))
    if params["rope_type"] == "yarn" and params.get("factor") is None:
        if params.get("mscale_all_dim"):  # the reference's softmax scale reads the null factor, and fails
            raise UnsupportedCheckpoint("rope_type 'yarn' with mscale_all_dim needs a factor, got null")
        params["factor"] = config["max_position_embeddings"] / params["original_max_position_embeddings"]
    return params


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def softmax_scale(params: Mapping[str, Any], qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under a scaled rope."""
    scale = qk_head_dim ** -0.5
    if params["rope_type"] != "default" and params.get("mscale_all_dim"):
        mscale = yarn_mscale(params["factor"], params["mscale_all_dim"])
        scale = scale * mscale * mscale
    return scale


def rope_inv_freq(config: Mapping[str, Any], dim: int) -> tuple[torch.Tensor, float]:
    """(float32 inverse frequencies [dim / 2], cos/sin attention factor), the reference's arithmetic."""
    params = rope_parameters(config)
    base = params["rope_theta"]
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    if params["rope_type"] == "default":
        return 1.0 / pos_freqs, 1.0
    factor = params["factor"]
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = yarn_mscale(factor)
    low, high = _correction_range(params, dim, base)
    if low == high:
        high += 0.001  # prevent a singular ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    return nonzero_frequencies(inv_freq, attention_factor, base), float(attention_factor)


def _correction_range(params: Mapping[str, Any], dim: int, base: float) -> tuple[float, float]:
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
    original = params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def prepared_weights(arch: Architecture, config, tensors: CheckpointTensors, interleaved: bool, attention_extra=None):
    """The weights in program layout, and the checkpoint names they were made from."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        weights += _layer_weights(arch, layer, take, interleaved, tensors, attention_extra)
    weights.append(NamedWeight("final_norm", take("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", rope_inv_freq(config, arch.head_dim)[0]))
    return tuple(weights), used


def _layer_weights(arch: Architecture, layer: int, take, interleaved: bool,
                   tensors: CheckpointTensors, attention_extra=None) -> list[NamedWeight]:
    src, dst, latent = f"model.layers.{layer}.", f"layers.{layer}.", arch.latent
    attn, mlp = src + "self_attn.", src + "mlp."
    heads = _HeadRows(arch, interleaved)
    out = [NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight"))]
    if latent.q_lora_rank:
        out += [NamedWeight(dst + "q_a.weight", take(attn + "q_a_proj.weight")),
                NamedWeight(dst + "q_a_norm", take(attn + "q_a_layernorm.weight")),
                NamedWeight(dst + "q_b.weight", heads.queries(take(attn + "q_b_proj.weight")))]
    else:
        out.append(NamedWeight(dst + "q.weight", heads.queries(take(attn + "q_proj.weight"))))
    out += [NamedWeight(dst + "kv_a.weight", heads.compressed(take(attn + "kv_a_proj_with_mqa.weight"))),
            NamedWeight(dst + "kv_a_norm", take(attn + "kv_a_layernorm.weight")),
            NamedWeight(dst + "kv_b.weight", take(attn + "kv_b_proj.weight")),
            NamedWeight(dst + "o.weight", take(attn + "o_proj.weight")),
            *(attention_extra(layer, take) if attention_extra is not None else ()),
            NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight"))]
    if arch.is_sparse(layer):
        return out + sparse_weights(arch, layer, take, tensors, _EXPERT_NAMES)
    return out + [NamedWeight(dst + "gate_up.weight", _gate_up(take, mlp)),
                  NamedWeight(dst + "down.weight", take(mlp + "down_proj.weight"))]


def _gate_up(take, prefix: str) -> torch.Tensor:
    return fused(take, [prefix + "gate_proj.weight", prefix + "up_proj.weight"])


class _HeadRows:
    """De-interleaves the rotary rows of projections (pairs (x0, x1), (x2, x3).. become halves)."""

    def __init__(self, arch: Architecture, interleaved: bool):
        self.latent = arch.latent
        rope = self.latent.qk_rope_head_dim
        self.order = torch.cat((torch.arange(0, rope, 2), torch.arange(1, rope, 2))) if interleaved else None

    def queries(self, weight: torch.Tensor) -> torch.Tensor:
        """[Hq (Dn + Dr), in]: each head's rotary rows reordered."""
        if self.order is None:
            return weight
        per_head = weight.view(-1, self.latent.qk_head_dim, weight.shape[1])
        nope, rope = per_head.split([self.latent.qk_nope_head_dim, self.latent.qk_rope_head_dim], dim=1)
        return torch.cat((nope, rope[:, self.order]), dim=1).reshape(weight.shape).contiguous()

    def compressed(self, weight: torch.Tensor) -> torch.Tensor:
        """[C + Dr, H]: the rotary-key rows reordered."""
        if self.order is None:
            return weight
        latent, rope = weight.split([self.latent.kv_lora_rank, self.latent.qk_rope_head_dim])
        return torch.cat((latent, rope[self.order])).contiguous()


def _is_extra_layer(name: str, num_layers: int) -> bool:
    """A tensor of a layer past the served ones (DeepSeek's multi-token-prediction layers)."""
    parts = name.split(".")
    return len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= num_layers

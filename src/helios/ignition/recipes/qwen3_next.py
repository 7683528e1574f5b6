"""Recipe for Qwen3-Next (`Qwen3NextForCausalLM`) and the Qwen3.5 text decoders (`Qwen3_5ForCausalLM`,
`Qwen3_5MoeForCausalLM`): hybrids of Gated DeltaNet and gated attention layers.

``layer_types`` (or, where missing, every ``full_attention_interval``-th layer, as Qwen3NextConfig
derives it) names each layer ``linear_attention`` - a Gated DeltaNet layer whose convolution window
and [Hv, Dk, Dv] state live in state rows (`helios.ignition.recurrent_geometry`,
`helios.ignition.delta_mixer`) - or ``full_attention``: grouped-query attention with per-head q/k
norms, rotary on the leading ``partial_rotary_factor`` of each head, and an output gate
(``q_proj`` emits each head's query then its gate; `Architecture.attention_gate`). Every layer has a
pre-norm and a post-norm, and its MLP is the mixture of experts (softmax top-k, ``norm_topk_prob``,
a shared expert scaled by sigmoid(``shared_expert_gate``): `MixtureOfExperts.shared_gate`) unless
``mlp_only_layers`` lists it, ``decoder_sparse_step`` skips it or ``num_experts`` is 0 (a gated
MLP of ``intermediate_size``).

Qwen3.5 has the same dataflow: its linear-attention projections come apart (in_proj_qkv, in_proj_z,
in_proj_b, in_proj_a, already in the prepared order), Qwen3_5ForCausalLM's MLP is dense in every
layer and Qwen3_5MoeForCausalLM's sparse in every layer (always renormalised top-k). Its rotary
tables are the interleaved multimodal rope of three position grids, which for text (every grid the
token's position) is the ordinary rope; the vision tower (``model.visual.*``, which the reference's
text model ignores too) is not served.

Prepared layout: the zero-centred RMS norms' (1 + w) folded into their weights (the layers', the
final and the q/k norms; the linear-attention output norm is a plain weight); q_proj's interleaved
query/gate rows split into the query rows and output-gate rows of ``qkv``; in_proj_qkvz /
in_proj_ba (grouped per key head) rearranged into q | k | v | z | b | a rows; A as -exp(A_log) in
float32; experts as `helios.ignition.recipes.moe` stacks them. The multi-token-prediction layers
(``mtp.*``) are not served and are skipped, as the reference skips them. Refused by name: an activation other than SiLU, a rope
type other than default, layer kinds other than the two, and tensor parallelism (`sharding`).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import (NamedWeight, Recipe, UnsupportedCheckpoint, conv_weight, fused,
                                         hybrid_layer_kinds, shaped)
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import ExpertNames, sparse_weights
from helios.ignition.recurrent_geometry import GatedDeltaNetGeometry

ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
_SKIPPED = ("mtp.", "model.visual.")  # multi-token prediction and the vision tower: not served
LAYER_KINDS = ("linear_attention", "full_attention")
_DTYPES = ("float32", "bfloat16", "float16")
_EXPERTS = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj", "shared_expert.")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(source, config, tensors, dtype)
    weights, used = prepared_weights(arch, config, tensors)
    unplaced = sorted(name for name in tensors.names - used if not name.startswith(_SKIPPED))
    if unplaced and not (arch.tie_word_embeddings and unplaced == ["lm_head.weight"]):
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def layer_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's kind, from ``layer_types`` or Qwen3NextConfig's ``full_attention_interval`` rule."""
    num_layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is None:
        interval = int(config.get("full_attention_interval", 4))
        if interval < 1:
            raise UnsupportedCheckpoint(f"full_attention_interval {interval} must be >= 1")
        kinds = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)]
    return hybrid_layer_kinds(kinds, num_layers, LAYER_KINDS)


def architecture_from_config(source: str, config: Mapping[str, Any], tensors: CheckpointTensors,
                             dtype: str | None) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    hidden, num_layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    num_heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // num_heads)
    rope = llama.rope_parameters(config, partial=True)
    if rope["rope_type"] != "default":
        raise UnsupportedCheckpoint(f"rope_type {rope['rope_type']!r} is not supported (only 'default')")
    kinds = layer_kinds(config)
    moe = mixture(source, config, num_layers)
    dense = moe is None or len(moe.sparse_layers) < num_layers
    bias = bool(config.get("attention_bias", False))
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]) if dense else 0, num_layers=num_layers,
        num_heads=num_heads, num_kv_heads=int(config.get("num_key_value_heads") or num_heads), head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), layer_windows=(0,) * num_layers,
        qkv_bias=bias, o_bias=bias, qk_norm=True, tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or _checkpoint_dtype(config, tensors),
        recurrent=GatedDeltaNetGeometry(
            layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
            num_key_heads=int(config["linear_num_key_heads"]), num_value_heads=int(config["linear_num_value_heads"]),
            key_head_dim=int(config["linear_key_head_dim"]), value_head_dim=int(config["linear_value_head_dim"]),
            conv_kernel=int(config["linear_conv_kernel_dim"])),
        rotary_dim=llama.rotary_width(config, head_dim), moe=moe, attention_gate=True,
    )


def mixture(source: str, config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts | None:
    """The sparse layers (None: none). Qwen3NextDecoderLayer's rule: sparse unless in mlp_only_layers,
    when num_experts > 0 and (layer + 1) % decoder_sparse_step == 0; Qwen3.5: dense or sparse throughout."""
    if source == "Qwen3_5ForCausalLM":
        return None
    experts, step = int(config.get("num_experts") or 0), int(config.get("decoder_sparse_step", 1))
    if source == "Qwen3_5MoeForCausalLM":
        sparse = tuple(range(num_layers))
    else:
        if experts > 0 and step < 1:
            raise UnsupportedCheckpoint(f"decoder_sparse_step {step} must be >= 1")
        dense = set(config.get("mlp_only_layers") or ())
        sparse = tuple(i for i in range(num_layers) if experts > 0 and i not in dense and (i + 1) % step == 0)
        if not sparse:
            return None
    shared = int(config["shared_expert_intermediate_size"])
    if shared < 1:
        raise UnsupportedCheckpoint(f"shared_expert_intermediate_size {shared} is not supported (a positive width: "
                                    f"the Qwen3-Next block always adds its gated shared expert)")
    return MixtureOfExperts(experts, int(config["num_experts_per_tok"]), int(config["moe_intermediate_size"]), sparse,
                            normalize=source == "Qwen3_5MoeForCausalLM" or bool(config.get("norm_topk_prob", True)),
                            shared_intermediate_size=shared,
                            shared_gate=True)


def prepared_weights(arch: Architecture, config: Mapping[str, Any], tensors: CheckpointTensors):
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    def centred(name: str) -> torch.Tensor:  # the zero-centred norm's (1 + w), in float32 as the reference
        used.add(name)
        return (1.0 + tensors.get(name).to(torch.float32)).to(arch.torch_dtype)

    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        weights.append(NamedWeight(dst + "input_norm", centred(src + "input_layernorm.weight")))
        if layer in arch.recurrent.layers:
            weights += _delta_weights(arch, src + "linear_attn.", dst + "delta.", take, tensors, used)
        else:
            weights += _attention_weights(arch, src + "self_attn.", dst, take, centred)
        weights.append(NamedWeight(dst + "post_norm", centred(src + "post_attention_layernorm.weight")))
        if arch.is_sparse(layer):
            weights += sparse_weights(arch, layer, take, tensors, _EXPERTS)
        else:
            weights += llama.dense_mlp_weights(arch, layer, take)
    weights.append(NamedWeight("final_norm", centred("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", llama.rope_inv_freq(config, arch.rotary_width, partial=True)))
    return tuple(weights), used


def _attention_weights(arch: Architecture, src: str, dst: str, take, centred) -> list[NamedWeight]:
    """q_proj's rows are per head [query D, gate D]: the queries lead ``qkv``, the gates end it."""
    def split(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = take(name)
        paired = rows.reshape(arch.num_heads, 2, arch.head_dim, *rows.shape[1:])
        return paired[:, 0].reshape(arch.q_size, *rows.shape[1:]), paired[:, 1].reshape(arch.q_size, *rows.shape[1:])

    def qkv(kind: str) -> torch.Tensor:
        query, gate = split(src + "q_proj." + kind)
        return torch.cat([query, take(src + "k_proj." + kind), take(src + "v_proj." + kind), gate]).contiguous()

    out = [NamedWeight(dst + "qkv.weight", qkv("weight"))]
    if arch.qkv_bias:
        out.append(NamedWeight(dst + "qkv.bias", qkv("bias")))
    out += [NamedWeight(dst + "q_norm", centred(src + "q_norm.weight")),
            NamedWeight(dst + "k_norm", centred(src + "k_norm.weight")),
            NamedWeight(dst + "o.weight", take(src + "o_proj.weight"))]
    if arch.o_bias:
        out.append(NamedWeight(dst + "o.bias", take(src + "o_proj.bias")))
    return out


def _delta_weights(arch: Architecture, src: str, dst: str, take, tensors, used: set) -> list[NamedWeight]:
    """Qwen3-Next's in_proj_qkvz / in_proj_ba hold, per key head, [q Dk, k Dk, v r Dv, z r Dv] and
    [b r, a r] rows (r value heads per key head); Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and
    in_proj_a are whole. The prepared in_proj holds q | k | v | z | b | a, head-major."""
    g: GatedDeltaNetGeometry = arch.recurrent
    if src + "in_proj_qkv.weight" in tensors:
        in_proj = fused(take, [src + f"in_proj_{name}.weight" for name in ("qkv", "z", "b", "a")])
    else:
        per_key = g.num_value_heads // g.num_key_heads
        rows = g.num_key_heads * 2 * (g.key_head_dim + per_key * g.value_head_dim)
        qkvz = shaped(take(src + "in_proj_qkvz.weight"), src + "in_proj_qkvz.weight", (rows, arch.hidden_size))
        qkvz = qkvz.reshape(g.num_key_heads, -1, arch.hidden_size)
        parts = qkvz.split([g.key_head_dim, g.key_head_dim, per_key * g.value_head_dim, per_key * g.value_head_dim],
                           1)
        ba = shaped(take(src + "in_proj_ba.weight"), src + "in_proj_ba.weight",
                    (2 * g.num_value_heads, arch.hidden_size))
        ba = ba.reshape(g.num_key_heads, 2 * per_key, arch.hidden_size).split(per_key, 1)
        in_proj = torch.cat([part.reshape(-1, arch.hidden_size) for part in (*parts, *ba)]).contiguous()
    used.add(src + "A_log")
    a = -torch.exp(tensors.get(src + "A_log").to(torch.float32))
    return [NamedWeight(dst + "in_proj.weight", in_proj),
            NamedWeight(dst + "conv.weight", conv_weight(take(src + "conv1d.weight"), src + "conv1d.weight",
                                                         g.conv_dim, g.conv_kernel)),
            NamedWeight(dst + "conv.bias", torch.zeros(g.conv_dim, dtype=arch.torch_dtype)),
            NamedWeight(dst + "dt_bias", take(src + "dt_bias")), NamedWeight(dst + "A", a),
            NamedWeight(dst + "norm", take(src + "norm.weight")),
            NamedWeight(dst + "out.weight", take(src + "out_proj.weight"))]


def _checkpoint_dtype(config: Mapping[str, Any], tensors: CheckpointTensors) -> str:
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared in _DTYPES:
        return declared
    return str(tensors.get("model.embed_tokens.weight").dtype).removeprefix("torch.")

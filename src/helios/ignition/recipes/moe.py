"""Recipe for mixture-of-experts decoders with Llama-family attention.

Covers Qwen3MoeForCausalLM (softmax top-k, ``norm_topk_prob``, dense ``mlp_only_layers`` and
``decoder_sparse_step``), Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B: Qwen3-MoE's routing and
dense layers without q/k norms, q/k/v biases by ``qkv_bias``, a shared expert of width
``shared_expert_intermediate_size`` whose output each token scales by sigmoid(``shared_expert_gate``)
of its input: `MixtureOfExperts.shared_gate`; sliding layers as Qwen2MoeConfig derives them: with
``use_sliding_window`` every other layer below ``max_window_layers`` unless ``layer_types`` says),
MixtralForCausalLM (softmax top-k, always normalised; sliding window on
every layer when set) and Glm4MoeForCausalLM (sigmoid scoring with ``e_score_correction_bias``,
``n_group`` / ``topk_group`` group-limited top-k, ``norm_topk_prob``, ``routed_scaling_factor``,
shared experts, the first ``first_k_dense_replace`` layers dense, partial rotary
``partial_rotary_factor`` (see `partial_rotary`), q/k norm where ``use_qk_norm``, q/k/v bias where
``attention_bias``).
Attention is the Llama recipe's (`helios.ignition.recipes.llama`); this module adds the experts:
per-expert gate/up/down tensors (``experts.N.gate_proj`` / ``w1`` style, or the fused
``experts.gate_up_proj`` / ``experts.down_proj`` layout) are stacked into [E, 2F, H] and [E, H, F],
the router weight and correction bias are kept in float32. GLM's multi-token-prediction layers
(``num_nextn_predict_layers``, stored after the last layer) are not served and are skipped, and so
are the zero-width shared-expert tensors transformers saves for ``n_shared_experts`` 0. Only GLM's
reference honours ``partial_rotary_factor``; Qwen3-MoE and Mixtral rotate whole heads, so a partial
factor there is refused rather than applied.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, NamedTuple

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Glm4MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class ExpertNames(NamedTuple):
    """Where a family keeps its sparse block: the module prefix, the per-expert projection names, the
    shared expert's module, the router's weight and its correction bias (all under the block)."""

    block: str
    gate: str
    up: str
    down: str
    shared: str = "shared_experts."
    router: str = "gate.weight"
    correction_bias: str = "gate.e_score_correction_bias"


# The families whose reference honours partial_rotary_factor (the others' rotate whole heads).
_PARTIAL_ROTARY = ("Glm4MoeForCausalLM",)

_NAMES = {
    "Qwen3MoeForCausalLM": ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj"),
    "Qwen2MoeForCausalLM": ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj", "shared_expert."),
    "MixtralForCausalLM": ExpertNames("block_sparse_moe.", "w1", "w3", "w2"),
    "Glm4MoeForCausalLM": ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj"),
}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if source == "Qwen2MoeForCausalLM":
        config = qwen2_moe_resolved(config, tensors)
    base = llama.architecture_from_config(source, config, tensors, dtype)
    moe = mixture_from_config(source, config, base.num_layers)
    dense = len(moe.sparse_layers) < base.num_layers
    arch = dataclasses.replace(base, moe=moe, intermediate_size=base.intermediate_size if dense else 0)
    if source not in _PARTIAL_ROTARY:
        llama.rope_parameters(config)  # refuses a partial_rotary_factor: the family rotates whole heads
    rotary = llama.rotary_width(config, arch.head_dim)
    inv_freq, transform = None, None
    if rotary < arch.head_dim:
        inv_freq, transform = partial_rotary(config, arch.head_dim, rotary)
    weights, used = llama.prepared_weights(arch, config, tensors, sparse_layer_weights(tensors, _NAMES[source]),
                                           inv_freq, transform)
    return llama.placed_recipe(source, arch, weights, used, tensors, lambda name: _ignored(name, arch, config, tensors))


def sparse_layer_weights(tensors: CheckpointTensors, names: ExpertNames):
    """`llama.prepared_weights`' layer_weights of Llama's attention with the dense MLP, or in sparse
    layers the router, experts and shared expert `names` spells (`sparse_weights`)."""
    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        slots = llama.attention_weights(arch, layer, take)
        if not arch.is_sparse(layer):
            return slots + llama.dense_mlp_weights(arch, layer, take)
        return slots + sparse_weights(arch, layer, take, tensors, names)

    return layer_weights


def mixture_from_config(source: str, config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts:
    """The routing and expert geometry the family's configuration declares."""
    top_k = int(config["num_experts_per_tok"])
    if source == "MixtralForCausalLM":
        return MixtureOfExperts(int(config["num_local_experts"]), top_k, int(config["intermediate_size"]),
                                tuple(range(num_layers)), normalize=True)
    if source in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        step, dense = int(config.get("decoder_sparse_step", 1)), set(config.get("mlp_only_layers") or ())
        sparse = tuple(i for i in range(num_layers) if experts > 0 and i not in dense and (i + 1) % step == 0)
        if not sparse:
            raise UnsupportedCheckpoint(f"a {source} checkpoint without sparse layers (num_experts, mlp_only_layers, "
                                        f"decoder_sparse_step) is a dense checkpoint")
        shared = int(config["shared_expert_intermediate_size"]) if source == "Qwen2MoeForCausalLM" else 0
        if source == "Qwen2MoeForCausalLM" and shared < 1:
            raise UnsupportedCheckpoint(f"shared_expert_intermediate_size {shared} is not supported (a positive "
                                        f"width: the Qwen2-MoE block always adds its gated shared expert)")
        return MixtureOfExperts(experts, top_k, int(config["moe_intermediate_size"]), sparse,
                                normalize=bool(config.get("norm_topk_prob", False)),
                                shared_intermediate_size=shared, shared_gate=shared > 0)
    first_sparse = int(config.get("first_k_dense_replace", 0))
    ffn = int(config["moe_intermediate_size"])
    experts, groups = int(config.get("n_routed_experts") or config["num_local_experts"]), int(config.get("n_group") or 1)
    if groups > 1 and experts < 2 * groups:  # a group's score is the sum of its two best experts
        raise UnsupportedCheckpoint(f"n_group {groups} leaves fewer than 2 of the {experts} routed experts per group")
    kept = int(config.get("topk_group") or 1) * experts // groups
    if groups > 1 and top_k > kept:  # the choice would fall on experts of dropped groups (ill-defined)
        raise UnsupportedCheckpoint(f"num_experts_per_tok {top_k} exceeds the {kept} experts of the topk_group "
                                    f"groups kept")
    return MixtureOfExperts(
        experts, top_k, ffn,
        tuple(range(first_sparse, num_layers)), scoring="sigmoid", num_groups=int(config.get("n_group") or 1),
        topk_groups=int(config.get("topk_group") or 1), normalize=bool(config.get("norm_topk_prob", True)),
        scale=float(config.get("routed_scaling_factor", 1.0)), correction_bias=True,
        shared_intermediate_size=ffn * int(config.get("n_shared_experts") or 0))


def qwen2_moe_resolved(config: Mapping[str, Any], tensors: CheckpointTensors) -> dict[str, Any]:
    """`config` with the layer kinds Qwen2MoeConfig derives where ``layer_types`` is missing (with
    ``use_sliding_window``: layers i < ``max_window_layers`` with i + 1 odd slide, the others are full);
    refused where the reference's model is not the one its tensors and keys describe: sliding layers
    without ``use_sliding_window`` (the config class sets the window to 0, with which the reference's
    sliding mask does not fit its attention: transformers 5.25 raises) or q/k/v bias tensors that
    ``qkv_bias`` does not declare (or declares and lacks)."""
    sliding, kinds = bool(config.get("use_sliding_window")), config.get("layer_types")
    num_layers = int(config["num_hidden_layers"])
    if kinds is None:
        first = int(config.get("max_window_layers") or 0)
        kinds = ["sliding_attention" if sliding and (i + 1) % 2 and i < first else "full_attention"
                 for i in range(num_layers)]
    elif not sliding and "sliding_attention" in kinds:
        raise UnsupportedCheckpoint("layer_types has sliding_attention layers but use_sliding_window is false "
                                    "(the reference's window is then 0, and its sliding mask does not fit)")
    declared, held = bool(config.get("qkv_bias", True)), "model.layers.0.self_attn.q_proj.bias" in tensors
    if declared != held:
        raise UnsupportedCheckpoint(f"config.json: qkv_bias {declared} but the checkpoint "
                                    f"{'lacks' if declared else 'holds'} q/k/v bias tensors")
    return {**config, "layer_types": kinds}


def rotary_order(head_dim: int, rotary: int) -> torch.Tensor:
    """A reordering of each head's dimensions under which rotating the leading `rotary` of them in
    [cos, sin] halves (pairs i, i + rotary / 2) is the whole-head rotation (pairs j, j + head_dim / 2)
    with zero frequencies past rotary / 2: position j < rotary / 2 holds dimension j, position
    head_dim / 2 + j holds dimension rotary / 2 + j, the pass-through dimensions fill the rest."""
    half, passing = rotary // 2, torch.arange(rotary, head_dim)
    split = (head_dim - rotary) // 2
    return torch.cat([torch.arange(half), passing[:split], torch.arange(half, rotary), passing[split:]])


def partial_rotary(config: Mapping[str, Any], head_dim: int, rotary: int):
    """(inv_freq [head_dim / 2], transform) for a family rotating `rotary` < head_dim dimensions: the
    queries' and keys' dimensions are reordered by `rotary_order` (q/k projection rows and biases,
    q/k norms; a consistent reordering of both leaves every q.k unchanged and values untouched), so
    the decoder's whole-head rotary (and its fused kernel) applies, with zero frequencies (cos 1,
    sin 0) on the pass-through pairs."""
    order = rotary_order(head_dim, rotary)
    inv_freq = torch.zeros(head_dim // 2, dtype=torch.float32)
    inv_freq[: rotary // 2] = llama.rope_inv_freq(config, rotary, partial=True)

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            return tensor[order]
        if not name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias",
                              "self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            return tensor
        heads = tensor.reshape(-1, head_dim, *tensor.shape[1:])
        return heads[:, order].reshape(tensor.shape).contiguous()

    return inv_freq, transform


def sparse_weights(arch: Architecture, layer: int, take, tensors: CheckpointTensors,
                   names: ExpertNames) -> list[NamedWeight]:
    """A sparse layer's router, stacked experts and shared expert, in `weight_layout` order."""
    moe, dst = arch.moe, f"layers.{layer}."
    block = f"model.layers.{layer}.{names.block}"
    out = [NamedWeight(dst + "router.weight", take(block + names.router).float())]
    if moe.correction_bias:
        bias = take(block + names.correction_bias).float()
        out.append(NamedWeight(dst + "router.correction_bias", bias.reshape(-1)))  # (Ernie stores [1, E])
    if block + "experts.gate_up_proj" in tensors:
        gate_up, down = take(block + "experts.gate_up_proj"), take(block + "experts.down_proj")
    else:
        experts = [f"{block}experts.{e}." for e in range(moe.num_experts)]
        gate_up = fused(lambda p: fused(take, [p + names.gate + ".weight", p + names.up + ".weight"]), experts,
                        stack=True)
        down = fused(take, [p + names.down + ".weight" for p in experts], stack=True)
    out += [NamedWeight(dst + "experts.gate_up", gate_up.contiguous()), NamedWeight(dst + "experts.down", down.contiguous())]
    if moe.shared_intermediate_size:
        shared = block + names.shared
        out += [NamedWeight(dst + "shared.gate_up.weight",
                            fused(take, [shared + "gate_proj.weight", shared + "up_proj.weight"])),
                NamedWeight(dst + "shared.down.weight", take(shared + "down_proj.weight"))]
    if moe.shared_gate:
        out.append(NamedWeight(dst + "shared.gate", take(block + "shared_expert_gate.weight")))
    return out


def is_empty_shared_expert(name: str, arch: Architecture, tensors: CheckpointTensors) -> bool:
    """A tensor of the zero-width shared expert transformers saves for ``n_shared_experts`` 0 (it adds
    nothing: its output is zeros)."""
    return (".shared_experts." in name and arch.moe is not None and not arch.moe.shared_intermediate_size
            and tensors.get(name).numel() == 0)


def _ignored(name: str, arch: Architecture, config: Mapping[str, Any], tensors: CheckpointTensors) -> bool:
    """Rotary buffers, the multi-token-prediction layers stored after the last decoder layer, and the
    empty shared-expert tensors transformers saves for ``n_shared_experts`` 0 (they add nothing)."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    if is_empty_shared_expert(name, arch, tensors):
        return True
    match = _LAYER_INDEX.match(name)
    return bool(match and int(config.get("num_nextn_predict_layers") or 0) > 0
                and int(match.group(1)) >= arch.num_layers)

"""Recipe for K-EXAONE checkpoints: ExaoneMoeForCausalLM (transformers' ExaoneMoeConfig).

EXAONE 4's attention (`helios.ignition.recipes.exaone4`: per-head q/k RMS norms before the rotation,
sliding and global layers by ``layer_types`` or ``sliding_window_pattern``, the global layers unrotated
where a ``sliding_window`` is set) in Llama's pre-norm block (``input_layernorm``,
``post_attention_layernorm``), with DeepSeek-V3's experts as ExaoneMoeSparseMoEBlock computes them:

- dense and sparse MLPs by ``mlp_layer_types`` (where config.json leaves it out: the first
  ``first_k_dense_replace`` layers dense);
- sigmoid scores of a float32 router (``mlp.gate.weight``) chosen with ``mlp.e_score_correction_bias``,
  ``n_group`` / ``topk_group`` groups scored by their best two, renormalised where
  ``norm_topk_prob``, scaled by ``routed_scaling_factor`` (``helios::moe_route``);
- ``num_experts`` experts of ``moe_intermediate_size`` beside one shared gated MLP of
  ``moe_intermediate_size * num_shared_experts`` (0 saves zero-width tensors, which add nothing).

ExaoneMoeConfig's defaults fill the keys config.json leaves out. Multi-token-prediction tensors
(``mtp.*``, which the reference ignores on load) are not served and are skipped. Refused by name:
another ``hidden_act``, malformed ``mlp_layer_types``, a checkpoint without sparse layers, and what
`exaone4` refuses (layer kinds the reference's config class cannot derive, a null ``head_dim``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import MixtureOfExperts
from helios.ignition.recipes import exaone4, llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import ExpertNames, is_empty_shared_expert, sparse_layer_weights

ARCHITECTURES = ("ExaoneMoeForCausalLM",)
_NAMES = ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj", correction_bias="e_score_correction_bias")
# ExaoneMoeConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"rms_norm_eps": 1e-5, "num_key_value_heads": 32, "sliding_window": 4096, "sliding_window_pattern": 4,
             "first_k_dense_replace": 1, "moe_intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8,
             "num_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
             "topk_group": 1}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    if "head_dim" in config and config["head_dim"] is None:  # the reference sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the K-EXAONE reference cannot size heads by")
    base = llama.architecture_from_config(
        source, {key: value for key, value in config.items() if key not in _UNREAD}, tensors, dtype)
    if not base.qk_norm:
        raise UnsupportedCheckpoint(f"{source} checkpoint has no q/k norm tensors (self_attn.q_norm.weight), "
                                    f"which every K-EXAONE layer holds")
    kinds = exaone4.layer_types(config, base.num_layers)
    windowed = config.get("sliding_window") is not None
    arch = dataclasses.replace(
        base, moe=mixture(config, base.num_layers), layer_windows=llama.sliding_layer_windows(config, kinds),
        nope_layers=tuple(i for i, kind in enumerate(kinds) if windowed and kind == "full_attention"))
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    weights, used = llama.prepared_weights(arch, config, tensors, sparse_layer_weights(tensors, _NAMES))
    return llama.placed_recipe(source, arch, weights, used, tensors,
                               lambda name: name.startswith("mtp.") or is_empty_shared_expert(name, arch, tensors))


def mixture(config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts:
    """The sparse layers (``mlp_layer_types``, else all from ``first_k_dense_replace`` on) and their routing."""
    kinds = config.get("mlp_layer_types")
    if kinds is None:
        first = config["first_k_dense_replace"]
        if isinstance(first, bool) or not isinstance(first, int):
            raise UnsupportedCheckpoint(f"config.json: first_k_dense_replace {first!r} must be an integer")
        kinds = ["dense" if i < first else "sparse" for i in range(num_layers)]
    if not isinstance(kinds, list) or len(kinds) != num_layers or not set(kinds) <= {"dense", "sparse"}:
        raise UnsupportedCheckpoint(f"config.json: mlp_layer_types {kinds!r} must list 'dense' or 'sparse' for "
                                    f"each of the {num_layers} layers")
    sparse = tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
    if not sparse:
        raise UnsupportedCheckpoint("a K-EXAONE checkpoint without sparse layers (mlp_layer_types, "
                                    "first_k_dense_replace) is not supported")
    width, shared = int(config["moe_intermediate_size"]), int(config["num_shared_experts"] or 0)
    experts, groups = int(config["num_experts"]), int(config["n_group"] or 1)
    top_k = int(config["num_experts_per_tok"])
    if groups > 1 and top_k > int(config["topk_group"] or 1) * experts // groups:
        raise UnsupportedCheckpoint(f"num_experts_per_tok {top_k} exceeds the experts of the topk_group groups kept")
    return MixtureOfExperts(
        experts, top_k, width, sparse, scoring="sigmoid", num_groups=groups,
        topk_groups=int(config["topk_group"] or 1), normalize=bool(config["norm_topk_prob"]),
        scale=float(config["routed_scaling_factor"]), correction_bias=True, shared_intermediate_size=width * shared)

"""Recipe for DeepSeek-V2 and DeepSeek-V2-Lite checkpoints (DeepseekV2ForCausalLM).

DeepSeek-V3's latent attention (`helios.ignition.recipes.deepseek`: the query through a low-rank pair
where ``q_lora_rank`` is set, V2-Lite's single projection where it is null; the key/value latent and
the shared rotary key; "default" or "yarn" rope with DeepSeek's ``mscale`` / ``mscale_all_dim``: the
same inverse frequencies, cos/sin attention factor and softmax scale as transformers computes them)
with V2's routing, as transformers 5.25's DeepseekV2TopkRouter computes it:

* p = softmax(router logits) over every routed expert;
* ``topk_method`` "greedy": the ``num_experts_per_tok`` largest p; "group_limited_greedy": the experts
  form ``n_group`` groups, a group scores its best p (V3 sums its best two), only the ``topk_group``
  best groups stay eligible (`helios::moe_route`'s "softmax" scoring with groups);
* the weights are the chosen p times ``routed_scaling_factor``, never renormalised;
* ``n_shared_experts`` shared experts of ``moe_intermediate_size`` each, the first
  ``first_k_dense_replace`` layers dense.

The rotary dims are always interleaved pairs (the reference rotates them as complex numbers; V2 has
no ``rope_interleave``), so the recipe de-interleaves them as V3's does under ``rope_interleave``.

Refused by name: ``norm_topk_prob`` true (transformers' router ignores it, DeepSeek's own code
renormalises: two different models), ``moe_layer_freq`` other than 1 (the same disagreement: DeepSeek's
code keeps the other layers dense, transformers makes every layer from ``first_k_dense_replace`` on
sparse), another ``topk_method`` or a ``scoring_func`` other than softmax (DeepSeek's config.json
spells it; transformers ignores it), ``attention_bias`` / ``mlp_bias``, fewer key/value heads than heads.
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.ignition.architecture import MixtureOfExperts
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.deepseek import check_key_heads, latent_architecture, latent_recipe

ARCHITECTURES = ("DeepseekV2ForCausalLM",)
TOPK_METHODS = ("greedy", "group_limited_greedy")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    check_key_heads(config)
    if config.get("mlp_bias"):
        raise UnsupportedCheckpoint(f"{source} mlp_bias is not supported")
    arch = latent_architecture(source, config, tensors, dtype, experts(config))
    return latent_recipe(source, arch, config, tensors, interleaved=True)


def experts(config: Mapping[str, Any]) -> MixtureOfExperts | None:
    """The routed layers (from first_k_dense_replace on) as DeepseekV2TopkRouter routes them, or None
    when every layer is dense."""
    num_layers = int(config["num_hidden_layers"])
    first_sparse = int(config.get("first_k_dense_replace") or 0)
    if first_sparse >= num_layers:
        return None
    if config.get("moe_layer_freq", 1) != 1:
        raise UnsupportedCheckpoint(f"moe_layer_freq {config['moe_layer_freq']!r} is not supported (transformers "
                                    f"ignores it: only 1, where both agree)")
    if config.get("norm_topk_prob"):
        raise UnsupportedCheckpoint("norm_topk_prob true is not supported (transformers' DeepSeek-V2 router ignores "
                                    "it, DeepSeek's code renormalises)")
    if config.get("scoring_func", "softmax") != "softmax":  # DeepSeek's V2 code raises on any other
        raise UnsupportedCheckpoint(f"scoring_func {config['scoring_func']!r} is not supported (only 'softmax')")
    method = config.get("topk_method", "greedy")
    if method not in TOPK_METHODS:
        raise UnsupportedCheckpoint(f"topk_method {method!r} is not one of {TOPK_METHODS}")
    num_experts, top_k = _count(config, "n_routed_experts"), _count(config, "num_experts_per_tok")
    groups = kept = 1
    if method == "group_limited_greedy":
        groups, kept = _count(config, "n_group"), _count(config, "topk_group")
        if num_experts % groups:
            raise UnsupportedCheckpoint(f"n_group {groups} does not divide n_routed_experts {num_experts}")
        if kept > groups:
            raise UnsupportedCheckpoint(f"topk_group {kept} exceeds n_group {groups}")
        if top_k > kept * (num_experts // groups):  # the reference picks zero-weight experts of dropped groups
            raise UnsupportedCheckpoint(f"num_experts_per_tok {top_k} exceeds the {kept * (num_experts // groups)} "
                                        f"experts of the topk_group groups kept")
    if top_k > num_experts:
        raise UnsupportedCheckpoint(f"num_experts_per_tok {top_k} exceeds n_routed_experts {num_experts}")
    width = _count(config, "moe_intermediate_size")
    shared = int(config.get("n_shared_experts") or 0)
    if shared < 0:
        raise UnsupportedCheckpoint(f"n_shared_experts {shared} must be >= 0")
    return MixtureOfExperts(
        num_experts, top_k, width, tuple(range(first_sparse, num_layers)), scoring="softmax", num_groups=groups,
        topk_groups=kept, normalize=False, scale=float(config.get("routed_scaling_factor", 1.0)),
        shared_intermediate_size=width * shared)


def _count(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedCheckpoint(f"config.json: {key} must be a positive integer, got {value!r}")
    return value

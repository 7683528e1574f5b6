"""Recipe for Ernie 4.5 mixture-of-experts checkpoints (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B,
ERNIE-4.5-300B-A47B).

Attention is Ernie 4.5 dense's (`helios.ignition.recipes.ernie4_5`: interleaved rotary pairs, each q/k
head's rows de-interleaved at preparation; full causal attention). The layers i with (i + 1) a
multiple of ``moe_layer_interval`` within [``moe_layer_start_index``, ``moe_layer_end_index``] (-1:
the last layer) hold a mixture, the others Llama's gated MLP of width ``intermediate_size``:

- a float32 router (``mlp.gate.weight``): p = softmax over the ``moe_num_experts`` experts; the
  ``moe_k`` experts of largest p + ``e_score_correction_bias`` (stored [1, E] as
  ``mlp.moe_statics.e_score_correction_bias``) are chosen and weighted by p renormalised: softmax
  scoring with a correction bias (`helios.abi.moe`), ``normalize``. The reference divides by
  max(sum, ``moe_norm_min``); a top-k sum of a softmax is at least k / E, so a ``moe_norm_min`` up to
  that changes nothing and a larger one is refused by name;
- experts of width ``moe_intermediate_size`` (stacked as `helios.ignition.recipes.moe` stacks them)
  and ``moe_num_shared_experts`` shared experts as one of width ``moe_num_shared_experts`` x
  ``moe_intermediate_size`` (``mlp.shared_experts``), added.

The multi-token-prediction tensors (``mtp`` in the name) are not served and are skipped, as the
reference skips them. ``use_bias`` (biases on every projection, the shared experts' and the lm head's
among them, which have no slot) is refused by name, as are a partial rotary factor and activations
other than SiLU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import ernie4_5, llama, moe
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Ernie4_5_MoeForCausalLM",)
_NAMES = moe.ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj",
                         correction_bias="moe_statics.e_score_correction_bias")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if config.get("use_bias"):
        raise UnsupportedCheckpoint("config.json: use_bias true is not supported (the shared experts' and the lm "
                                    "head's biases have no slot)")
    base = llama.architecture_from_config(source, config, tensors, dtype)
    experts = _mixture(config, base.num_layers)
    dense = len(experts.sparse_layers) < base.num_layers
    arch = dataclasses.replace(base, moe=experts, intermediate_size=base.intermediate_size if dense else 0)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        slots = llama.attention_weights(arch, layer, take)
        if not arch.is_sparse(layer):
            return slots + llama.dense_mlp_weights(arch, layer, take)
        return slots + moe.sparse_weights(arch, layer, take, tensors, _NAMES)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights,
                                           transform=ernie4_5.deinterleaved(arch.head_dim))
    skipped = {name for name in tensors.names if "mtp" in name}  # the reference's unexpected keys
    return llama.placed_recipe(source, arch, weights, used | skipped, tensors)


def _mixture(config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts:
    num_experts, top_k = int(config["moe_num_experts"]), int(config["moe_k"])
    start, interval = int(config["moe_layer_start_index"]), int(config["moe_layer_interval"])
    end = int(config["moe_layer_end_index"])
    end = num_layers - 1 if end == -1 else end
    if interval < 1:
        raise UnsupportedCheckpoint(f"config.json: moe_layer_interval {interval} must be positive")
    sparse = tuple(i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end)
    if not sparse:
        raise UnsupportedCheckpoint("an Ernie4_5_MoeForCausalLM checkpoint without sparse layers "
                                    "(moe_layer_start_index, moe_layer_end_index, moe_layer_interval) is not supported")
    floor = config.get("moe_norm_min")
    if floor is not None and num_experts > 0 and float(floor) > top_k / num_experts:
        raise UnsupportedCheckpoint(f"config.json: moe_norm_min {floor} is not supported (above {top_k} / "
                                    f"{num_experts}, a floor some top-k sums would meet)")
    width = int(config["moe_intermediate_size"])
    return MixtureOfExperts(num_experts, top_k, width, sparse, scoring="softmax", normalize=True, correction_bias=True,
                            shared_intermediate_size=width * int(config.get("moe_num_shared_experts") or 0))

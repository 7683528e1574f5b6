"""Recipe for Hunyuan mixture-of-experts checkpoints (HunYuanMoEV1ForCausalLM: Hunyuan-A13B).

Attention is Hunyuan dense's (`helios.ignition.recipes.hunyuan`: q/k norms after the rotation,
NTK-alpha rope, biases by ``attention_bias``, an integer ``head_dim`` required; full causal
attention). Every layer's MLP is a mixture, as transformers' HunYuanMoEV1Moe computes it:

- a float32 router ``mlp.gate.wg.weight`` [E, H]: softmax over the ``num_experts`` experts, the top
  ``moe_topk``, renormalised to sum 1 (softmax scoring, ``normalize``);
- experts of width ``intermediate_size`` (``mlp.experts.N.gate_proj`` / ``up_proj`` / ``down_proj``,
  stacked as `helios.ignition.recipes.moe` stacks them);
- a shared expert ``mlp.shared_mlp`` of width ``intermediate_size`` too, always added.

The reference reads one expert count (its experts module cannot take a per-layer list) and takes
``moe_topk`` per layer where it is a list: a list of one value is that value, a list of several is
refused by name (one routing per model; so is a list of another length than the layers), as is a
``num_experts`` list. Keys the reference does not
read (``moe_intermediate_size``, ``num_shared_expert``, ``use_mixed_mlp_moe``, ...) change nothing:
the tensors' shapes must be the ones it reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import hunyuan, llama, moe
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("HunYuanMoEV1ForCausalLM",)
_NAMES = moe.ExpertNames("mlp.", "gate_proj", "up_proj", "down_proj", shared="shared_mlp.", router="gate.wg.weight")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    hunyuan.check_head_dim(config)
    config = hunyuan.with_static_rope(config)
    base = llama.architecture_from_config(source, config, tensors, dtype)
    width = int(config["intermediate_size"])
    layers = tuple(range(base.num_layers))
    experts = MixtureOfExperts(_one_value(config, "num_experts", None), _one_value(config, "moe_topk", len(layers)),
                               width, layers, normalize=True, shared_intermediate_size=width)
    arch = dataclasses.replace(base, moe=experts, intermediate_size=0, qk_norm=True, qk_norm_after_rotary=True)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return hunyuan.attention_weights(arch, layer, take) + moe.sparse_weights(arch, layer, take, tensors, _NAMES)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def _one_value(config: Mapping[str, Any], key: str, num_layers: int | None) -> int:
    """config.json's `key` as one integer: where the reference reads a per-layer list (`num_layers`
    given), a list of one value per layer, all equal, is that value; anything else is refused naming
    the key."""
    value = config[key]
    if isinstance(value, list):
        if num_layers is None or len(value) != num_layers or len(set(value)) != 1:
            raise UnsupportedCheckpoint(f"config.json: {key} {value!r:.80} is not supported (one value for every "
                                        f"layer)")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnsupportedCheckpoint(f"config.json: {key} must be an integer, got {value!r}")
    return value

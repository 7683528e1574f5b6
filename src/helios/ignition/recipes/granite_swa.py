"""Recipe for Granite checkpoints with sliding windows and attention sinks: GraniteSWAForCausalLM and
GraniteMoeSWAForCausalLM (transformers' GraniteSWAConfig / GraniteMoeSWAConfig).

Granite's decoder (`helios.ignition.recipes.granite`: its four multipliers read and folded as there)
or Granite MoE Shared's (`helios.ignition.recipes.granite_moe`: top-k softmax experts in every layer,
the shared expert where ``shared_intermediate_size`` > 0), with, as GraniteSWAAttention computes them:

- sliding and full layers by ``layer_types`` (where config.json has none, every fourth layer from the
  first full, the others sliding over ``sliding_window``);
- a learned sink per query head (``self_attn.sinks``): the reference scales each head's attended values
  by sigmoid(logsumexp(scores) - sink), which is a softmax with one more logit, the sink
  (`Architecture.attention_sinks`, gpt-oss's ``layers.i.sinks``);
- a rope base per layer (``layer_rope_theta``; 0 for a layer without positions, ``nope_layers``): the
  layers of the most common base rotate with ``rope.inv_freq``, those of a second base with
  ``rope.local_inv_freq`` (``local_rope_layers``); a third base is refused by name, and so is a second
  base under a rope type whose attention factor is not 1 (the second table is unscaled).

The config classes' defaults fill the keys config.json leaves out (GraniteSWA: a window of 128, tied
embeddings, epsilon 1e-5, 4 key/value heads).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Mapping

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import granite, granite_moe, llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM")
_DEFAULTS = {
    "GraniteSWAForCausalLM": {"rms_norm_eps": 1e-5, "num_key_value_heads": 4, "tie_word_embeddings": True,
                              "sliding_window": 128},
    "GraniteMoeSWAForCausalLM": {"rms_norm_eps": 1e-6, "num_local_experts": 8, "num_experts_per_tok": 2,
                                 "intermediate_size": 11008, "shared_intermediate_size": 0, "sliding_window": 128},
}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS[source], **config}
    if "head_dim" in config and config["head_dim"] is None:  # the attention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Granite reference cannot size heads by")
    num_layers = int(config["num_hidden_layers"])
    if config.get("layer_types") is None:  # GraniteSWAConfig's: full at every i % 4 == 0, sliding elsewhere
        config["layer_types"] = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(num_layers)]
    multipliers = granite.read_multipliers(config)
    base = llama.architecture_from_config(source, config, tensors, dtype)
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    thetas = layer_thetas(config, num_layers)
    main, local = rope_bases(thetas)
    if local is not None and base.rotary_factor != 1.0:
        raise UnsupportedCheckpoint(f"layer_rope_theta's second base {local} under a rope type whose attention "
                                    f"factor is {base.rotary_factor} (the second table is unscaled)")
    arch = dataclasses.replace(
        base, moe=mixture(source, config, num_layers), attention_sinks=True,
        intermediate_size=0 if source == "GraniteMoeSWAForCausalLM" else base.intermediate_size,
        embedding_scale=multipliers["embedding_multiplier"],
        query_pre_attn_scalar=multipliers["attention_multiplier"] ** -2,
        nope_layers=tuple(i for i, theta in enumerate(thetas) if not theta),
        local_rope_layers=tuple(i for i, theta in enumerate(thetas) if theta and theta == local))
    outputs = granite_moe._RESIDUAL_OUTPUTS if arch.moe is not None else granite._RESIDUAL_OUTPUTS

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        *attention, post_norm = llama.attention_weights(arch, layer, take)
        sinks = NamedWeight(f"layers.{layer}.sinks", take(f"model.layers.{layer}.self_attn.sinks").float())
        mlp = (granite_moe.sparse_weights(arch, layer, take, tensors) if arch.moe is not None
               else llama.dense_mlp_weights(arch, layer, take))
        return [*attention, sinks, post_norm, *mlp]

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq=_inv_freq(config, main, arch),
                                           transform=granite.folded_multipliers(multipliers, outputs))
    if arch.local_rope_layers:
        weights += (NamedWeight("rope.local_inv_freq", _inv_freq(config, local, arch)),)
    recipe = llama.placed_recipe(source, arch, weights, used, tensors)
    return dataclasses.replace(recipe, inputs_embeds_scale=multipliers["embedding_multiplier"])


def layer_thetas(config: Mapping[str, Any], num_layers: int) -> tuple[float, ...]:
    """Each layer's rope base: ``layer_rope_theta``, else the rope settings' base for every layer."""
    thetas = config.get("layer_rope_theta")
    if thetas is None:
        return (float(llama.rope_parameters(config)["rope_theta"]),) * num_layers
    if (not isinstance(thetas, list) or len(thetas) != num_layers
            or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0 for t in thetas)):
        raise UnsupportedCheckpoint(f"config.json: layer_rope_theta {thetas!r:.120} must list a base >= 0 (0: no "
                                    f"positions) for each of the {num_layers} layers")
    return tuple(float(t) for t in thetas)


def rope_bases(thetas: tuple[float, ...]) -> tuple[float | None, float | None]:
    """(the main table's base, the second table's or None): the most common nonzero base first."""
    counts = Counter(theta for theta in thetas if theta)
    if len(counts) > 2:
        raise UnsupportedCheckpoint(f"layer_rope_theta has {len(counts)} distinct bases {sorted(counts)}; at most 2 "
                                    f"are supported (two rotary tables)")
    ordered = [theta for theta, _ in counts.most_common()]
    return (ordered + [None, None])[0], (ordered + [None, None])[1]


def mixture(source: str, config: Mapping[str, Any], num_layers: int) -> MixtureOfExperts | None:
    if source != "GraniteMoeSWAForCausalLM":
        return None
    return MixtureOfExperts(int(config["num_local_experts"]), int(config["num_experts_per_tok"]),
                            int(config["intermediate_size"]), tuple(range(num_layers)), scoring="topk_softmax",
                            shared_intermediate_size=int(config.get("shared_intermediate_size") or 0))


def _inv_freq(config: Mapping[str, Any], theta: float | None, arch: Architecture):
    """The rotary frequencies of the rope settings with base `theta` (None: every layer unrotated)."""
    params = {**llama.rope_parameters(config), "rope_theta": theta or 10000.0}
    return llama.rope_inv_freq({**config, "rope_parameters": params, "rope_scaling": None}, arch.head_dim)

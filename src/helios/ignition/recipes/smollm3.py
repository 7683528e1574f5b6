"""Recipe for SmolLM3 checkpoints (SmolLM3ForCausalLM).

The decoder is Llama's, and the llama recipe prepares its weights, biases (``attention_bias`` puts
one on q, k, v and o; ``mlp_bias`` on the MLP) and rope settings ("default", "linear", "llama3",
"yarn"; whole heads). What SmolLM3 adds, read as SmolLM3Config and SmolLM3Attention read it:

- NoPE layers. ``no_rope_layers`` holds a flag per layer (at least one per layer; 1: the layer
  rotates its queries and keys, 0: it attends without rotary embeddings); where config.json leaves
  it out, every ``no_rope_layer_interval``-th layer (the 4th, 8th, ... by default) is NoPE. They
  become `Architecture.nope_layers`.
- Sliding windows by ``layer_types``; where config.json leaves it out, the NoPE layers slide over
  ``sliding_window`` when ``use_sliding_window`` is set and the window is not null. The reference's
  eager and SDPA attention slide a layer by its mask (``layer_types``), its flash attention only
  with ``use_sliding_window``: sliding layers without it are refused (the two disagree).
- The reference's defaults (rope_theta 2e6, 4 key/value heads, tied embeddings) fill a terse
  config.json (`helios.ignition.recipes.defaults`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("SmolLM3ForCausalLM",)


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    num_layers = int(config["num_hidden_layers"])
    if "head_dim" in config and config["head_dim"] is None:  # SmolLM3Attention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the SmolLM3 reference cannot size heads by")
    rotary = rotary_layers(config, num_layers)
    config = {**config, "layer_types": layer_types(config, rotary)}
    arch = llama.architecture_from_config(source, config, tensors, dtype)
    arch = dataclasses.replace(arch, nope_layers=tuple(i for i, rotates in enumerate(rotary) if not rotates))
    weights, used = llama.prepared_weights(arch, config, tensors)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def rotary_layers(config: Mapping[str, Any], num_layers: int) -> tuple[bool, ...]:
    """Whether each layer rotates (SmolLM3Config's ``no_rope_layers``, or its interval rule)."""
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval")
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise UnsupportedCheckpoint(f"config.json: no_rope_layer_interval must be a positive integer, "
                                        f"got {interval!r}")
        return tuple((layer + 1) % interval != 0 for layer in range(num_layers))
    if not isinstance(flags, list) or not all(flag in (0, 1) and not isinstance(flag, float) for flag in flags):
        raise UnsupportedCheckpoint(f"config.json: no_rope_layers must be a list of 0/1 flags, got {flags!r:.80}")
    if len(flags) < num_layers:
        raise UnsupportedCheckpoint(f"config.json: no_rope_layers has {len(flags)} flags for {num_layers} layers")
    return tuple(bool(flag) for flag in flags[:num_layers])


def layer_types(config: Mapping[str, Any], rotary: tuple[bool, ...]) -> list[str]:
    """Each layer's attention kind as the reference masks it; sliding layers need
    ``use_sliding_window`` (the reference's attention kernels disagree without it)."""
    kinds = config.get("layer_types")
    if kinds is None:
        slides = bool(config.get("use_sliding_window")) and config.get("sliding_window") is not None
        return ["sliding_attention" if slides and not rotates else "full_attention" for rotates in rotary]
    if isinstance(kinds, list) and "sliding_attention" in kinds and not config.get("use_sliding_window"):
        raise UnsupportedCheckpoint("config.json: layer_types has sliding_attention layers without "
                                    "use_sliding_window (the reference slides them in eager attention only)")
    return kinds

"""Recipe for EXAONE 4.0 checkpoints: Exaone4ForCausalLM (transformers' Exaone4Config).

The decoder is Llama's grouped-query attention and gated SiLU MLP with OLMo 2's block and Qwen3's
q/k norms, each an `Architecture` switch:

- no norm before the attention or the MLP (``pre_norms`` False): ``post_attention_layernorm`` and
  ``post_feedforward_layernorm`` norm the block outputs before their residual adds
  (``sandwich_norms``: ``layers.i.attn_out_norm``, ``layers.i.mlp_out_norm``), ``model.norm`` is the
  final norm (the weights are placed as `helios.ignition.recipes.olmo`'s);
- per-head q/k RMS norms (``qk_norm``, weights [D]) before the rotation;
- sliding and global layers by ``layer_types`` (where config.json leaves it out: every
  ``sliding_window_pattern``-th layer global, the others sliding over ``sliding_window``). Where a
  ``sliding_window`` is set, the global layers attend without rotary embeddings (``nope_layers``):
  Exaone4Attention rotates only sliding layers then; with ``sliding_window`` null every layer rotates
  and attends fully.

Exaone4Config's defaults fill the keys a config.json leaves out (``rms_norm_eps`` 1e-5,
``sliding_window`` 4096, ``sliding_window_pattern`` 4, 32 key/value heads). Refused by name: another
``hidden_act``, rope types other than Llama's (default, linear, llama3, yarn), a partial rotary factor,
malformed ``layer_types``, sliding layers without a positive ``sliding_window``, and a
``sliding_window_pattern`` the reference cannot turn into layer kinds (a string or 0, which its config
class fails on, unless ``layer_types`` is given).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.recipes import llama, olmo
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Exaone4ForCausalLM",)
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if "head_dim" in config and config["head_dim"] is None:  # Exaone4Attention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the EXAONE 4 reference cannot size heads by")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, plain, tensors, dtype)
    kinds = layer_types(config, base.num_layers)
    windowed = config.get("sliding_window") is not None
    arch = dataclasses.replace(
        base, layer_windows=llama.sliding_layer_windows(config, kinds), sandwich_norms=True, pre_norms=False,
        qk_norm=True, nope_layers=tuple(i for i, kind in enumerate(kinds) if windowed and kind == "full_attention"))
    weights, used = llama.prepared_weights(arch, config, tensors, olmo.layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind as Exaone4Config resolves it: ``layer_types``, else sliding but
    for every ``sliding_window_pattern``-th layer (a pattern of 0 where ``sliding_window`` is null)."""
    kinds = config.get("layer_types")
    if kinds is not None:
        return llama.listed_layer_types(kinds, num_layers)
    pattern = 0 if config.get("sliding_window") is None else config.get("sliding_window_pattern")
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise UnsupportedCheckpoint(f"config.json: sliding_window_pattern {pattern!r} (with sliding_window "
                                    f"{config.get('sliding_window')!r}) gives no layer kinds without layer_types "
                                    f"(the reference's config class fails on it)")
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers))

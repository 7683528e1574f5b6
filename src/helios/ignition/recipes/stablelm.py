"""Recipe for StableLM checkpoints (StableLM 2, StableLM-3B-4E1T, StableCode): StableLmForCausalLM
(transformers' StableLmConfig).

The decoder is Llama's grouped-query attention and gated MLP with these differences, each an
`Architecture` switch:

- every norm is ``nn.LayerNorm`` with a bias (``layer_norm``, ``norm_bias``); epsilon ``layer_norm_eps``;
- ``use_parallel_residual``: the parallel block (``parallel_block``), attention and MLP both read the
  ``input_layernorm`` output and their sum is added to the residual stream (no
  ``post_attention_layernorm``); otherwise Llama's sequential block;
- ``qk_layernorm``: per-head q/k LayerNorms without bias (``qk_norm_heads``: the checkpoint's
  ``q_layernorm.norms.h`` weights stacked head-major), before the rotation;
- partial rotary: the leading ``head_dim * partial_rotary_factor`` dimensions of each head rotate in
  halves (0.25 by default; `helios.ignition.recipes.moe.partial_rotary`, whose reordering of each
  head's q/k dimensions the per-head norm weights follow: a LayerNorm's statistics do not depend on
  the order);
- ``use_qkv_bias``: q/k/v biases; heads are ``hidden_size / num_attention_heads`` wide
  (StableLmAttention's sizing); a ``head_dim`` is read only by the reference's rotary table, so one
  that changes the table's width is refused (the reference fails on it).

StableLmConfig's defaults fill the keys a config.json leaves out (``layer_norm_eps`` 1e-5, 32 key/value
heads, ``partial_rotary_factor`` 0.25). The reference masks causally over the whole context; its
dropouts are training-only. Refused by name: a ``hidden_act`` other than ``silu`` or
``gelu_pytorch_tanh`` (the gated MLP's ops), rope types other than Llama's (default, linear, llama3,
yarn), a partial rotary factor that leaves no even rotated width, a ``layer_norm_eps`` that is not a
finite number.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.recipes import llama, starcoder2
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import partial_rotary, rotary_order

ARCHITECTURES = ("StableLmForCausalLM",)
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # the gated MLP's
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps", "hidden_act",
           "head_dim")


def rotary_table_width(config: Mapping[str, Any], head_dim: int) -> int:
    """The rotated width of heads `head_dim` (hidden_size / heads) wide (`llama.rotary_width`); an
    UnsupportedCheckpoint where the config's ``head_dim``, which only the reference's rotary table reads
    (StableLM's, GPT-NeoX's), sizes that table otherwise (the reference fails on it)."""
    rotary = llama.rotary_width(config, head_dim)
    declared = config.get("head_dim")
    if declared and (isinstance(declared, bool) or not isinstance(declared, int) or int(
            declared * llama.rope_parameters(config, partial=True)["partial_rotary_factor"]) != rotary):
        raise UnsupportedCheckpoint(f"config.json: head_dim {declared!r} gives a rotary table of another width than "
                                    f"the {rotary} dimensions of the hidden_size / num_attention_heads wide heads "
                                    f"that the reference rotates")
    return rotary


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    activation = llama.mlp_activation(config, _ACTIVATIONS)
    eps = llama.norm_epsilon(config, "layer_norm_eps")
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rms_norm_eps": eps}, tensors, dtype)
    qk = bool(config.get("qk_layernorm"))
    arch = dataclasses.replace(base, layer_norm=True, norm_bias=True, mlp_activation=activation, qk_norm=qk,
                               qk_norm_heads=qk, parallel_block=bool(config.get("use_parallel_residual")))
    rotary = rotary_table_width(config, arch.head_dim)
    inv_freq, spread = partial_rotary(config, arch.head_dim, rotary)
    order = rotary_order(arch.head_dim, rotary)

    def layer_weights(arch, layer: int, take):
        def read(name: str) -> torch.Tensor:  # the q/k norms: one LayerNorm per head, stacked, reordered
            for kind, heads in (("q", arch.num_heads), ("k", arch.num_kv_heads)):
                if name.endswith(f"self_attn.{kind}_norm.weight"):
                    stem = name.removesuffix(f"{kind}_norm.weight") + f"{kind}_layernorm.norms."
                    return torch.cat([take(f"{stem}{head}.weight")[order] for head in range(heads)])
            return take(name)

        return starcoder2.layer_norm_attention_weights(arch, layer, read) + llama.dense_mlp_weights(arch, layer, take)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq, spread)
    return llama.placed_recipe(source, arch, *starcoder2.with_final_norm_bias(arch, weights, used, tensors), tensors)

"""Recipe for GLM-4 dense checkpoints: Glm4ForCausalLM (GLM-4-0414, GLM-Z1; transformers' Glm4Config), and
GLM v1 (GlmForCausalLM: GLM-4-9B, GLM-Edge; GlmConfig), the same decoder without the sandwich norms.

The decoder is Llama's grouped-query attention with these differences:

- sandwich norms (``sandwich_norms``): ``post_self_attn_layernorm`` norms the attention output and
  ``post_mlp_layernorm`` the MLP output, each before its residual add (``layers.i.attn_out_norm``,
  ``layers.i.mlp_out_norm``); ``input_layernorm`` and ``post_attention_layernorm`` are the norms
  before the attention and the MLP, as in Llama;
- the fused ``mlp.gate_up_proj`` (rows: gate, then up) is the prepared ``gate_up`` as it is;
- q/k/v biases where the checkpoint holds them (``attention_bias``, true in Glm4Config); no o or
  MLP bias;
- partial, interleaved rotary: the reference rotates the leading ``head_dim * partial_rotary_factor``
  dimensions of each head (0.5 by default) in interleaved pairs (dims 2i and 2i + 1 by frequency i)
  and passes the rest through. Each q and k head's rows (and biases) are reordered here so that the
  programs' whole-head rotation in halves does the same (`rotary_layout`: the rotated pairs
  de-interleaved, then `helios.ignition.recipes.moe.rotary_order`, with zero frequencies for the
  pass-through pairs); one permutation of both q and k leaves every q.k unchanged.

Glm4Config's and GlmConfig's defaults (`helios.ignition.recipes.defaults`) fill the keys a config.json leaves out
(its ``rms_norm_eps`` 1.5625e-7, ``head_dim`` 128, ``partial_rotary_factor`` 0.5, ...). The
reference attends causally over the whole context: a window or ``layer_types`` in config.json are
not read. Refused by name: another ``hidden_act``, rope types other than Llama's (default, linear,
llama3, yarn), a partial rotary factor that leaves no even rotated width.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import rotary_order

ARCHITECTURES = ("Glm4ForCausalLM", "GlmForCausalLM")
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types")  # the reference masks causally
_ROTATED = tuple(f"self_attn.{proj}.{kind}" for proj in ("q_proj", "k_proj") for kind in ("weight", "bias"))


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {key: value for key, value in config.items() if key not in _UNREAD}
    arch = dataclasses.replace(llama.architecture_from_config(source, config, tensors, dtype),
                               sandwich_norms=source == "Glm4ForCausalLM")
    rotary = llama.rotary_width(config, arch.head_dim)
    order = rotary_layout(arch.head_dim, rotary)
    inv_freq = torch.zeros(arch.head_dim // 2, dtype=torch.float32)
    inv_freq[: rotary // 2] = llama.rope_inv_freq(config, rotary, partial=True)

    weights, used = llama.prepared_weights(arch, config, tensors, _layer_weights, inv_freq, rotary_rows(order))
    return llama.placed_recipe(source, arch, weights, used, tensors)


def rotary_rows(order: torch.Tensor):
    """A `llama.prepared_weights` transform: q and k projection rows (and biases) with each head's
    dimensions in `order` (a head is ``len(order)`` rows)."""
    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not name.endswith(_ROTATED):
            return tensor
        heads = tensor.reshape(-1, len(order), *tensor.shape[1:])
        return heads[:, order].reshape(tensor.shape).contiguous()
    return transform


def rotary_layout(head_dim: int, rotary: int) -> torch.Tensor:
    """The order of a head's dimensions under which the programs' rotation (halves of the whole head,
    zero frequencies past rotary / 2) is GLM's: the leading `rotary` dimensions' interleaved pairs
    (2i, 2i + 1) moved to (i, i + rotary / 2), then `rotary_order`'s spread over the whole head."""
    halves = torch.cat((torch.arange(0, rotary, 2), torch.arange(1, rotary, 2), torch.arange(rotary, head_dim)))
    return halves[rotary_order(head_dim, rotary)]


def _layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    *attention, before_mlp = llama.attention_weights(arch, layer, take)  # ends with post_attention_layernorm
    mlp = src + "mlp."
    if arch.sandwich_norms:
        attention.append(NamedWeight(dst + "attn_out_norm", take(src + "post_self_attn_layernorm.weight")))
    out = attention + [before_mlp, NamedWeight(dst + "gate_up.weight", take(mlp + "gate_up_proj.weight")),
                       NamedWeight(dst + "down.weight", take(mlp + "down_proj.weight"))]
    if arch.sandwich_norms:
        out.append(NamedWeight(dst + "mlp_out_norm", take(src + "post_mlp_layernorm.weight")))
    return out

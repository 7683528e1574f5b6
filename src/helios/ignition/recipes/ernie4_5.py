"""Recipe for Ernie 4.5 dense checkpoints (Ernie4_5ForCausalLM).

The decoder is Llama's (``use_bias`` puts a bias on q, k, v, o and the MLP projections, taken from
what the checkpoint holds; full causal attention; the llama recipe's rope types on whole heads),
except the rotary layout: the reference rotates interleaved pairs (dims 2i and 2i + 1 by frequency
i; GLM's ``rotate_half``), where the programs rotate halves (dims i and i + D/2). The rows of each
query and key head (and their biases) are de-interleaved here (even dims first, then odd): the same
permutation of q and k leaves every q.k unchanged, and each pair then sits where the programs
rotate it by the same frequency. The reference rotates in float32 whatever the dtype; a float32
core equals it, a bfloat16 one rotates in bfloat16 as every other family does.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.recipes import llama
from helios.ignition.recipes.base import Recipe
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Ernie4_5ForCausalLM",)
_ROTATED = tuple(f"self_attn.{proj}.{kind}" for proj in ("q_proj", "k_proj") for kind in ("weight", "bias"))


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = llama.architecture_from_config(source, config, tensors, dtype)
    weights, used = llama.prepared_weights(arch, config, tensors, transform=deinterleaved(arch.head_dim))
    return llama.placed_recipe(source, arch, weights, used, tensors)


def deinterleaved(head_dim: int):
    """The checkpoint transform (name, tensor) -> tensor that de-interleaves each q and k head's rows
    (and biases) into halves: even dims first, then odd (shared with `helios.ignition.recipes.ernie4_5_moe`)."""
    order = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))

    def halves(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not name.endswith(_ROTATED):
            return tensor
        heads = tensor.shape[0] // head_dim
        return tensor.reshape(heads, head_dim, *tensor.shape[1:])[:, order].reshape(tensor.shape)

    return halves

"""Latent attention over the positions a token-selecting indexer picks (``Architecture.indexer``, see
`helios.ignition.token_indexer` for the dataflow and `helios.abi.sparse_index` for the ops).

Every step attends in the absorbed form (``helios::paged_latent_attention_selected``): the
up-projected form of prompt programs gathers whole pages, which a selection of a few positions
per query does not need. A scoring layer writes its index keys, scores and selects; a layer that
reuses a selection takes the one the nearest earlier scoring layer of the same step made, which
`IndexStorage.latest` carries from layer to layer while a program is traced.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

import helios.abi.layer_norm  # noqa: F401  (registers helios::layer_norm)
import helios.abi.sparse_index  # noqa: F401  (registers the indexer ops)
from helios.abi.fused import apply_rotary
from helios.ignition.architecture import Architecture


class IndexStorage(NamedTuple):
    """One step's indexer storage: every scoring layer's key plane, and the latest selection."""

    index_cache: torch.Tensor  # [scoring layers, pages, page_tokens, D], written in place
    latest: list  # [the int64 [T, topk] selection of the last scoring layer run], filled while tracing


def selected_positions(arch: Architecture, w, layer: int, hidden, q_latent, shared) -> torch.Tensor:
    """int64 [T, topk]: the positions each packed token of `layer` attends to (-1: none); a scoring
    layer writes this step's index keys first. `hidden` is the layer's normed input, `q_latent` the
    normed query latent (``q_a_norm``'s output)."""
    indexer, step = arch.indexer, shared.step
    storage: IndexStorage = step.index
    plane_index = indexer.plane_index(layer)
    if plane_index is None:
        return storage.latest[0]
    prefix, num_tokens = f"layers.{layer}.indexer.", hidden.shape[0]
    q = F.linear(q_latent, w[prefix + "q.weight"]).view(num_tokens, indexer.num_heads, indexer.head_dim)
    k = torch.ops.helios.layer_norm(F.linear(hidden, w[prefix + "k.weight"]), w[prefix + "k_norm"],
                                    w[prefix + "k_norm_bias"], indexer.norm_eps)
    q = _rotated(q, indexer.rope_dim, shared.cos, shared.sin)
    k = _rotated(k.unsqueeze(1), indexer.rope_dim, shared.cos, shared.sin).squeeze(1)
    plane = storage.index_cache[plane_index]
    torch.ops.helios.index_key_write(plane, k.contiguous(), step.slot_mapping)
    weights = F.linear(hidden.to(torch.float32), w[prefix + "weights"]) * indexer.num_heads ** -0.5
    selected = torch.ops.helios.index_topk(q.contiguous(), weights, plane, step.page_table, step.query_start,
                                           step.positions, indexer.head_dim ** -0.5, indexer.topk)
    storage.latest[:] = [selected]
    return selected


def _rotated(x: torch.Tensor, rope_dim: int, cos, sin) -> torch.Tensor:
    """`x` [T, heads, D] with its first `rope_dim` values rotated in halves, the rest as they are."""
    rotary, rest = x.split([rope_dim, x.shape[-1] - rope_dim], dim=-1)
    return torch.cat((apply_rotary(rotary, cos, sin), rest), dim=-1)


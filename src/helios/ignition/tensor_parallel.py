"""The tensor-parallel steps of the generic decoder: where one rank's partial results are combined.

Megatron-style sharding (`helios.ignition.sharding` cuts the weights): q/k/v and gate/up are
column-parallel (each rank computes its heads and its share of the MLP width, no communication),
o and down are row-parallel (each rank's partial product is summed over the ranks with
``helios::all_reduce``; a bias is added once, after the sum), the embedding and the head are
vocabulary-parallel (a rank looks up only ids in its rows and the sum recovers the row; each rank
computes logits for its vocabulary rows and ``helios::all_gather`` assembles them).

With ``arch.tensor_parallel == 1`` every function here is exactly the single-rank expression, so
single-rank programs do not change. Results are identical on every rank (the collectives
distribute one reduced value), which is what lets every rank sample the same token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import helios.abi.collectives  # noqa: F401  (registers helios::all_reduce and helios::all_gather)
from helios.ignition.architecture import Architecture


def embed_tokens(arch: Architecture, embed: torch.Tensor, vocab_start, token_ids: torch.Tensor) -> torch.Tensor:
    """[T, H] embeddings of `token_ids`; a rank holding rows [start, start + vocab_rows) contributes
    only the ids among them and zeros elsewhere, so the sum over ranks is exact."""
    if arch.tensor_parallel == 1:
        return F.embedding(token_ids, embed)
    local = token_ids - vocab_start
    is_local = (local >= 0) & (local < arch.vocab_rows)
    rows = F.embedding(torch.where(is_local, local, torch.zeros_like(local)), embed)
    rows = torch.where(is_local[:, None], rows, torch.zeros_like(rows))
    return torch.ops.helios.all_reduce(rows, arch.tensor_parallel)


def row_parallel_linear(arch: Architecture, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """x @ weight.T (+ bias) where x and weight hold this rank's share of the inner dimension."""
    if arch.tensor_parallel == 1:
        return F.linear(x, weight, bias)
    summed = torch.ops.helios.all_reduce(F.linear(x, weight), arch.tensor_parallel)
    return summed if bias is None else summed + bias


def partial_sum(arch: Architecture, x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of each rank's partial result `x` (x itself on one rank)."""
    if arch.tensor_parallel == 1:
        return x
    return torch.ops.helios.all_reduce(x, arch.tensor_parallel)


def vocab_logits(arch: Architecture, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """float32 logits [N, V] over the whole vocabulary from this rank's head rows."""
    logits = F.linear(hidden, head).to(torch.float32)
    if arch.tensor_parallel == 1:
        return logits
    gathered = torch.ops.helios.all_gather(logits, arch.tensor_parallel)  # [ranks, N, vocab_rows]
    whole = gathered.permute(1, 0, 2).reshape(hidden.shape[0], arch.tensor_parallel * arch.vocab_rows)
    return whole[:, : arch.vocab_size]

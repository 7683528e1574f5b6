"""The tensor-parallel steps of the generic decoder: where one rank's partial results are combined.

Megatron-style sharding (`helios.ignition.sharding` cuts the weights): q/k/v and gate/up are
column-parallel (each rank computes its heads and its share of the MLP width, no communication),
o and down are row-parallel (each rank's partial product is summed over the ranks with
``helios::all_reduce``; a bias is added once, after the sum), the embedding and the head are
vocabulary-parallel (a rank looks up only ids in its rows and the sum recovers the row; each rank
computes logits for its vocabulary rows and ``helios::all_gather`` assembles them where a program
needs whole rows: speculative verification, scored prompts).

Sampling never assembles the vocabulary: each rank samples from its own logit rows through the
vocabulary-shard ops (`helios.abi.vocab_shards`: greedy rows exchange only each rank's best
candidate; a step that may draw gathers the rows), which return the single-rank tokens and
log-probabilities on every rank. A bias-free row-parallel output is returned as a `Partial` and
summed by the residual update itself (``helios::all_reduce_add_rms_norm``, one op where the
single-rank program runs ``helios::add_rms_norm``).

With ``arch.tensor_parallel == 1`` every function here is exactly the single-rank expression, so
single-rank programs do not change. Results are identical on every rank (the collectives
distribute one reduced value), which is what lets every rank sample the same token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

import helios.abi.collectives  # noqa: F401  (registers helios::all_reduce and helios::all_gather)
import helios.abi.reduce_norm  # noqa: F401  (registers helios::all_reduce_add_rms_norm)
import helios.abi.vocab_shards  # noqa: F401  (registers helios::sample_vocab_shard, token_logprobs_vocab_shard)
from helios.ignition.architecture import Architecture


class Partial(NamedTuple):
    """A rank's share of a row-parallel output, still to be summed over the ranks (by `residual_norm`)."""

    value: torch.Tensor


def embed_tokens(arch: Architecture, embed: torch.Tensor, vocab_start, token_ids: torch.Tensor) -> torch.Tensor:
    """[T, H] embeddings of `token_ids` times ``arch.embedding_scale`` (in the embeddings' dtype, as
    Gemma's scaled embedding multiplies); a rank holding rows [start, start + vocab_rows) contributes
    only the ids among them and zeros elsewhere, so the sum over ranks is exact."""
    if arch.tensor_parallel == 1:
        return _scaled(arch, F.embedding(token_ids, embed))
    local = token_ids - vocab_start
    is_local = (local >= 0) & (local < arch.vocab_rows)
    rows = F.embedding(torch.where(is_local, local, torch.zeros_like(local)), embed)
    rows = torch.where(is_local[:, None], rows, torch.zeros_like(rows))
    return _scaled(arch, torch.ops.helios.all_reduce(rows, arch.tensor_parallel))


def _scaled(arch: Architecture, rows: torch.Tensor) -> torch.Tensor:
    return rows if arch.embedding_scale == 1.0 else rows * arch.embedding_scale


def capped(arch: Architecture, logits: torch.Tensor) -> torch.Tensor:
    """float32 `logits` under ``arch.logit_softcap`` c > 0: tanh(logits / c) * c (elementwise, so a
    rank caps its own vocabulary rows); unchanged without one."""
    if not arch.logit_softcap:
        return logits
    return torch.tanh(logits / arch.logit_softcap) * arch.logit_softcap


def row_parallel_linear(arch: Architecture, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """x @ weight.T (+ bias) where x and weight hold this rank's share of the inner dimension."""
    if arch.tensor_parallel == 1:
        return F.linear(x, weight, bias)
    summed = torch.ops.helios.all_reduce(F.linear(x, weight), arch.tensor_parallel)
    return summed if bias is None else summed + bias


def row_parallel_output(arch: Architecture, x: torch.Tensor, weight: torch.Tensor, bias):
    """`row_parallel_linear`, except that under tensor parallelism without a bias the rank's
    `Partial` product is returned unsummed: `residual_norm` sums it with the residual update."""
    if arch.tensor_parallel == 1 or bias is not None:
        return row_parallel_linear(arch, x, weight, bias)
    return Partial(F.linear(x, weight))


def residual_norm(arch: Architecture, hidden: torch.Tensor, delta, weight: torch.Tensor, eps: float):
    """(hidden + delta, its RMS norm): ``helios::add_rms_norm``, or for a `Partial` delta
    ``helios::all_reduce_add_rms_norm`` (the same values: the sum over ranks, then add and norm)."""
    if isinstance(delta, Partial):
        return torch.ops.helios.all_reduce_add_rms_norm(hidden, delta.value, weight, eps, arch.tensor_parallel)
    return torch.ops.helios.add_rms_norm(hidden, delta, weight, eps)


def summed(arch: Architecture, delta) -> torch.Tensor:
    """`delta` summed over the ranks (a `Partial`), or `delta` itself."""
    return partial_sum(arch, delta.value) if isinstance(delta, Partial) else delta


def partial_sum(arch: Architecture, x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of each rank's partial result `x` (x itself on one rank)."""
    if arch.tensor_parallel == 1:
        return x
    return torch.ops.helios.all_reduce(x, arch.tensor_parallel)


def vocab_logits(arch: Architecture, hidden: torch.Tensor, head: torch.Tensor, bias=None) -> torch.Tensor:
    """float32 logits [N, V] over the whole vocabulary from this rank's head rows (and their `bias`
    entries, ``arch.head_bias``; `capped`)."""
    logits = capped(arch, F.linear(hidden, head, bias).to(torch.float32))
    if arch.tensor_parallel == 1:
        return logits
    gathered = torch.ops.helios.all_gather(logits, arch.tensor_parallel)  # [ranks, N, vocab_rows]
    whole = gathered.permute(1, 0, 2).reshape(hidden.shape[0], arch.tensor_parallel * arch.vocab_rows)
    return whole[:, : arch.vocab_size]


def sampled_logits(arch: Architecture, hidden: torch.Tensor, head: torch.Tensor, bias=None) -> torch.Tensor:
    """float32 logits of `hidden` to sample from: [N, V] on one rank; under tensor parallelism this
    rank's vocabulary rows only, [N, vocab_rows] (ids from ``vocab.start``; the last rank's rows
    past V are padding), which `sample_tokens` and `token_scores` take as they are (`capped`; with
    the rows' `bias` entries under ``arch.head_bias``)."""
    return capped(arch, F.linear(hidden, head, bias).to(torch.float32))


def with_logit_bias(logits: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, vocab_start=None) -> torch.Tensor:
    """`logits` plus each row's bias at its listed ids (-1 pads; ids of one row are distinct). With
    `vocab_start` (tensor parallelism) `logits` is a shard and only ids among its columns apply."""
    if vocab_start is None:
        return logits.scatter_add(1, ids.clamp(min=0), torch.where(ids >= 0, values, torch.zeros_like(values)))
    local = ids - vocab_start
    inside = (ids >= 0) & (local >= 0) & (local < logits.shape[1])
    return logits.scatter_add(1, torch.where(inside, local, torch.zeros_like(local)),
                              torch.where(inside, values, torch.zeros_like(values)))


def sample_tokens(arch: Architecture, logits, vocab_start, draw: tuple, penalties, counts, grammar_mask, mask_rows):
    """``helios::sample`` of the rows (`draw`: seeds, counters, temperature, top_k, top_p, min_p;
    `counts`: the rows' prompt and output counts) from `sampled_logits`; under tensor parallelism
    ``helios::sample_vocab_shard``, the same tokens on every rank."""
    if arch.tensor_parallel == 1:
        return torch.ops.helios.sample(logits, *draw, penalties, *counts, grammar_mask, mask_rows)
    return torch.ops.helios.sample_vocab_shard(logits, vocab_start, arch.vocab_size, *draw, penalties, *counts,
                                               grammar_mask, mask_rows, arch.tensor_parallel)


def token_scores(arch: Architecture, logits, vocab_start, tokens, penalties, counts, grammar_mask, mask_rows,
                 width: int):
    """``helios::token_logprobs`` of `tokens` from `sampled_logits` (under tensor parallelism
    ``helios::token_logprobs_vocab_shard``)."""
    if arch.tensor_parallel == 1:
        return torch.ops.helios.token_logprobs(logits, tokens, penalties, *counts, grammar_mask, mask_rows, width)
    return torch.ops.helios.token_logprobs_vocab_shard(logits, vocab_start, arch.vocab_size, tokens, penalties,
                                                       *counts, grammar_mask, mask_rows, width, arch.tensor_parallel)

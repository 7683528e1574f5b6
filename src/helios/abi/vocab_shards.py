"""Execution ABI: sampling and log-probabilities from a tensor-parallel rank's vocabulary shard.

A tensor-parallel rank computes the logits of its own vocabulary rows only (ids ``vocab_start`` to
``vocab_start + S``; ids >= V in the last rank's rows are padding). Instead of gathering every
rank's logits and sampling the whole vocabulary on every rank, a program calls these ops on its
shard; they return exactly what ``helios::sample`` / ``helios::token_logprobs`` return for the
whole row, identically on every rank:

``helios::sample_vocab_shard(Tensor logits, Tensor vocab_start, int vocab_size, Tensor seeds,
Tensor counters, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor penalties,
Tensor prompt_counts, Tensor output_counts, Tensor grammar_mask, Tensor mask_rows, int ranks) -> Tensor``
    logits float32 [R, S] (this rank's columns), vocab_start int64 [1]; every other tensor as in
    ``helios::sample`` over the whole vocabulary V (counts [R, V], mask [R, ceil(V / 32)]).
    int64 [R]: ``helios::sample`` of the row made of every rank's shard, bit for bit.
``helios::token_logprobs_vocab_shard(Tensor logits, Tensor vocab_start, int vocab_size, Tensor tokens,
Tensor penalties, Tensor prompt_counts, Tensor output_counts, Tensor grammar_mask, Tensor mask_rows,
int num_top, int ranks) -> (Tensor, Tensor, Tensor)``
    ``helios::token_logprobs`` of the whole row (num_top up to min(MAX_TOP, V), wider than a shard too).

How (`ShardedSampling`, what a program's calls are bound to with its rank group, like the
collectives of `helios.abi.collectives`):

- Greedy rows need only the winners. Each rank applies steps 1-4 of ``helios::sample`` to its
  columns (elementwise: the same float64 values the whole row would have), takes its best value and
  lowest id holding it, and the ranks all-gather these [R, 2] pairs; the best value wins, the lower
  rank (hence the lower id) on ties: the reference's argmax, bit for bit. A step exchanges 16 bytes
  per row instead of 4 V / N. On CUDA the shard's best comes from the fused greedy pass of
  ``helios::sample`` (one read of the logits; counts and mask words read only in rows that need
  them) where the shard starts on a mask-word boundary and holds no padding (Llama 3 and Qwen
  vocabularies over 2, 4 or 8 ranks do); rank r's shard starts at r * S, as the sharding writes
  ``vocab.start``. Elsewhere, and on the CPU, torch ops over the shard.
- A row that draws (temperature > 0) needs the whole distribution in the reference's summation
  order, so a call that may draw all-gathers the float32 shards and runs ``helios::sample`` on the
  whole row (the single-rank computation on the same values). On the CPU a call decides this from
  its inputs (every rank holds the same ones, so all take the same path); on a device nothing is
  read on the host: the `SampleVariant.FULL` binding always gathers and the `SampleVariant.GREEDY`
  binding (the greedy CUDA graph, replayed only for steps in which no row draws) never does.
- Log-probabilities: three small all-gathers: the row's maximum, its sum of exp(value - maximum)
  (added in rank order), then each rank's chosen-token and `num_top` best (log-probability, id)
  pairs, merged by log-probability descending, id ascending. Each log-probability is formed as
  ``log_softmax`` forms it, (value - maximum) - log(sum); only the sum's order differs from the
  whole row's, so values agree to float64 rounding and the ids are the reference's.

Failures and devices are those of the collectives (`CollectiveError`; gloo for CPU tensors, the
device group for device tensors); an unbound op raises `CollectiveError`. Nothing here reads device
data on the host on a device, so bound calls can be captured into a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from helios.abi.collectives import CollectiveError, RankGroup, register_group_op
from helios.abi.grammar import MASK_WORD_BITS, check_mask_args
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_tensor
from helios.abi.sampling import (
    NO_TOKEN, NUM_PENALTIES, DrawParams, SampleVariant, apply_penalties, check_sample_args, selective,
)
from helios.abi.sampling_cpu import allows_every_token
from helios.abi.token_logprobs import MAX_TOP

SAMPLE_SHARD_SCHEMA = (
    "(Tensor logits, Tensor vocab_start, int vocab_size, Tensor seeds, Tensor counters, Tensor temperature, "
    "Tensor top_k, Tensor top_p, Tensor min_p, Tensor penalties, Tensor prompt_counts, Tensor output_counts, "
    "Tensor grammar_mask, Tensor mask_rows, int ranks) -> Tensor"
)
LOGPROBS_SHARD_SCHEMA = (
    "(Tensor logits, Tensor vocab_start, int vocab_size, Tensor tokens, Tensor penalties, Tensor prompt_counts, "
    "Tensor output_counts, Tensor grammar_mask, Tensor mask_rows, int num_top, int ranks) -> (Tensor, Tensor, Tensor)"
)
_SAMPLE, _LOGPROBS = "helios::sample_vocab_shard", "helios::token_logprobs_vocab_shard"
_NEG_INF = float("-inf")
_F32_MAX = torch.finfo(torch.float32).max
_F64_MAX = torch.finfo(torch.float64).max
_NEUTRAL_PENALTIES = (1.0, 0.0, 0.0)


def _check_shard(op: str, logits, vocab_start, vocab_size: int, ranks: int) -> tuple[int, int]:
    """Validate the shard inputs; return (R, S)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise AbiArgumentError(f"{op}: logits must be a float32 shard [R, S]")
    check_tensor(op, "vocab_start", vocab_start, torch.int64, (1,))
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise AbiArgumentError(f"{op}: ranks must be an int >= 2, got {ranks!r}")
    num_rows, shard = logits.shape
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 0 < vocab_size <= shard * ranks:
        raise AbiArgumentError(f"{op}: vocab_size {vocab_size!r} does not fit {ranks} shards of {shard}")
    return num_rows, shard


def _whole_shaped(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A [R, V] stand-in of the whole row's metadata (expand: no copy) for the whole-row checks."""
    return logits[:, :1].expand(logits.shape[0], vocab_size)


def check_sample_shard_args(logits, vocab_start, vocab_size, params: DrawParams, penalties, counts, grammar_mask,
                            mask_rows, ranks) -> tuple[int, int]:
    rows, shard = _check_shard(_SAMPLE, logits, vocab_start, vocab_size, ranks)
    check_sample_args(_whole_shaped(logits, vocab_size), params, penalties, counts, grammar_mask, mask_rows)
    return rows, shard


def check_logprobs_shard_args(logits, vocab_start, vocab_size, tokens, penalties, counts, grammar_mask, mask_rows,
                              num_top, ranks) -> tuple[int, int]:
    rows, shard = _check_shard(_LOGPROBS, logits, vocab_start, vocab_size, ranks)
    check_mask_args(_LOGPROBS, _whole_shaped(logits, vocab_size), grammar_mask, mask_rows)
    # As ``helios::token_logprobs`` over the whole row: a shard narrower than `num_top` gives all its columns.
    if isinstance(num_top, bool) or not isinstance(num_top, int) or not 0 <= num_top <= min(MAX_TOP, vocab_size):
        raise AbiArgumentError(f"{_LOGPROBS}: num_top must lie in [0, {min(MAX_TOP, vocab_size)}], got {num_top!r}")
    check_tensor(_LOGPROBS, "tokens", tokens, torch.int64, (rows,))
    check_tensor(_LOGPROBS, "penalties", penalties, torch.float32, (rows, NUM_PENALTIES))
    for name, tensor in zip(("prompt_counts", "output_counts"), counts):
        check_tensor(_LOGPROBS, name, tensor, torch.int32, (rows, vocab_size))
    return rows, shard


def shard_ids(vocab_start: torch.Tensor, shard: int) -> torch.Tensor:
    """int64 [S]: the global ids of the shard's columns (>= V for padding columns)."""
    return vocab_start + torch.arange(shard, dtype=torch.int64, device=vocab_start.device)


def shard_values(logits, ids, vocab_size: int, penalties, counts, grammar_mask, mask_rows) -> torch.Tensor:
    """float64 [R, S]: steps 1-4 of ``helios::sample`` on the shard's columns (the values the whole
    row has there, bit for bit: every step is elementwise); padding columns are -inf."""
    columns = ids.clamp(max=vocab_size - 1)
    values = torch.nan_to_num(logits.to(torch.float64), nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    values = apply_penalties(values, penalties, counts[0].index_select(1, columns),
                             counts[1].index_select(1, columns))
    words = grammar_mask.index_select(1, torch.div(columns, MASK_WORD_BITS, rounding_mode="floor"))
    allowed = ((words >> (columns % MASK_WORD_BITS).to(torch.int32)) & 1).bool()
    suppressed = (mask_rows.unsqueeze(-1) & ~allowed) | (ids >= vocab_size)
    return torch.nan_to_num(values.masked_fill(suppressed, _NEG_INF), nan=_NEG_INF, posinf=_F64_MAX,
                            neginf=_NEG_INF)


def _plain_greedy(logits, ids, vocab_size: int, temperature, penalties, grammar_mask, mask_rows) -> torch.Tensor | None:
    """CPU only: float32 values of the shard when no row draws, none is penalised and every masked
    row allows every token (`helios.abi.sampling_cpu`'s fast path), else None."""
    if logits.device.type != "cpu":
        return None
    neutral = torch.tensor(_NEUTRAL_PENALTIES)
    special = (temperature > 0).any() | (penalties != neutral).any()
    restricted = (mask_rows & ~allows_every_token(grammar_mask, vocab_size)).any()
    if any(torch.stack((special, restricted)).tolist()):
        return None
    values = torch.nan_to_num(logits, nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    return values.masked_fill(ids >= vocab_size, _NEG_INF)


@dataclass(frozen=True)
class ShardedSampling:
    """The two ops bound to one rank group (`bind_collectives`), under one sampling variant
    (`SampleVariant`: whether rows may draw, and which whole-row pipeline a drawing call runs)."""

    group: RankGroup
    variant: SampleVariant = SampleVariant.FULL

    def with_sample_variant(self, variant: SampleVariant) -> ShardedSampling:
        return replace(self, variant=variant)

    def sample(self, logits, vocab_start, vocab_size: int, seeds, counters, temperature, top_k, top_p, min_p,
               penalties, prompt_counts, output_counts, grammar_mask, mask_rows, ranks: int) -> torch.Tensor:
        params = DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
        counts = (prompt_counts, output_counts)
        check_sample_shard_args(logits, vocab_start, vocab_size, params, penalties, counts, grammar_mask,
                                mask_rows, ranks)
        group = _group_of(self.group, _SAMPLE, ranks)
        if self._gathers(temperature):
            whole = _gathered(group, logits, vocab_size)
            return self.variant(whole, *params, penalties, prompt_counts, output_counts, grammar_mask, mask_rows)
        start = group.rank * logits.shape[1]  # the sharding's `vocab.start` of this rank
        if logits.device.type == "cuda" and kernel_fits(start, logits.shape[1], vocab_size):
            return _exchange(group, *shard_best_kernel(logits, start, penalties, counts, grammar_mask, mask_rows))
        ids = shard_ids(vocab_start, logits.shape[1])
        values = _plain_greedy(logits, ids, vocab_size, temperature, penalties, grammar_mask, mask_rows)
        if values is None:
            values = shard_values(logits, ids, vocab_size, penalties, counts, grammar_mask, mask_rows)
        return _winners(group, values, ids)

    def _gathers(self, temperature: torch.Tensor) -> bool:
        """Whether the call assembles the whole rows: a variant that draws, where a row may draw (on
        the CPU, decided from `temperature`; on a device always)."""
        if not self.variant.draws:
            return False
        return bool((temperature > 0).any()) if selective(temperature.device) else True

    def token_logprobs(self, logits, vocab_start, vocab_size: int, tokens, penalties, prompt_counts, output_counts,
                       grammar_mask, mask_rows, num_top: int, ranks: int):
        counts = (prompt_counts, output_counts)
        check_logprobs_shard_args(logits, vocab_start, vocab_size, tokens, penalties, counts, grammar_mask,
                                  mask_rows, num_top, ranks)
        group = _group_of(self.group, _LOGPROBS, ranks)
        ids = shard_ids(vocab_start, logits.shape[1])
        values = shard_values(logits, ids, vocab_size, penalties, counts, grammar_mask, mask_rows)
        return _merged_logprobs(group, values, ids, tokens, num_top)


def _group_of(group: RankGroup | None, op: str, ranks: int) -> RankGroup:
    if group is None:
        raise CollectiveError(f"{op}: no rank group is bound to this program (bind it with bind_collectives)")
    if group.size != ranks:
        raise AbiArgumentError(f"{op}: the program was captured for {ranks} ranks; the bound group has {group.size}")
    return group


def _gathered(group: RankGroup, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [R, V]: every rank's shard, in id order (the single-rank logits)."""
    out = logits.new_empty((group.size, *logits.shape))
    group.all_gather_into(out, logits.contiguous())
    return out.permute(1, 0, 2).reshape(logits.shape[0], -1)[:, :vocab_size]


def kernel_fits(start: int, shard: int, vocab_size: int) -> bool:
    """Whether `shard_best_kernel` takes a shard (static: shapes and rank only): its mask words
    start on a word boundary and it holds no padding column."""
    return start % MASK_WORD_BITS == 0 and shard % MASK_WORD_BITS == 0 and start + shard <= vocab_size


def shard_best_kernel(logits, start: int, penalties, counts, grammar_mask, mask_rows):
    """(best value float64 [R], its global id int64 [R]) of the shard's columns [start, start + S)
    through the fused greedy pass of ``helios::sample`` (`helios.abi.triton_sampling`) on views of
    the counts and mask words (no copy): the argmax of `shard_values`, lowest id on ties, and its
    value recomputed elementwise exactly as `shard_values` forms it (-inf where none is above -inf).
    The caller checks `kernel_fits`."""
    from helios.abi.triton_sampling import greedy_tokens

    shard = logits.shape[1]
    columns = (counts[0][:, start:start + shard], counts[1][:, start:start + shard])
    words = grammar_mask[:, start // MASK_WORD_BITS:(start + shard) // MASK_WORD_BITS]
    index = greedy_tokens(logits, penalties, *columns, words, mask_rows)
    found = index >= 0
    at = torch.where(found, index, 0).unsqueeze(-1)
    value = torch.nan_to_num(logits.gather(1, at).to(torch.float64), nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    value = apply_penalties(value, penalties, columns[0].gather(1, at), columns[1].gather(1, at)).squeeze(-1)
    value = torch.nan_to_num(value, nan=_NEG_INF, posinf=_F64_MAX, neginf=_NEG_INF)
    return torch.where(found, value, _NEG_INF), at.squeeze(-1) + start


def _winners(group: RankGroup, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the whole row's argmax (lowest id on ties) from every rank's best (value, id)."""
    best, index = values.to(torch.float64).max(dim=-1)  # the first maximum: the shard's lowest id
    return _exchange(group, best, ids[index])


def _exchange(group: RankGroup, best: torch.Tensor, best_ids: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the winner of every rank's (best value, its id), the lower rank on ties."""
    out = _gather(group, torch.stack((best, best_ids.to(torch.float64)), dim=-1))
    best_rank = out[..., 0].argmax(dim=0, keepdim=True)  # the first maximum: the lowest rank, hence id
    token = out[..., 1].gather(0, best_rank).squeeze(0).to(torch.int64)
    has_candidate = out[..., 0].amax(dim=0) > _NEG_INF
    return torch.where(has_candidate, token, NO_TOKEN)


def _gather(group: RankGroup, local: torch.Tensor) -> torch.Tensor:
    out = local.new_empty((group.size, *local.shape))
    group.all_gather_into(out, local.contiguous())
    return out


def _merged_logprobs(group: RankGroup, values, ids, tokens, num_top: int):
    """(chosen, top_ids, top_logprobs) of the whole row (module docstring): the row's maximum, then
    its sum of exp(value - maximum), each over the ranks, give each rank its columns'
    log-probabilities as ``log_softmax`` forms them, (value - maximum) - log(sum); then the ranks'
    best (log-probability, id) pairs and the chosen token's are merged. Each rank offers its best
    min(num_top, S) pairs: the ranks' S columns together hold the vocabulary, so at least `num_top`."""
    rows, offered = values.shape[0], min(num_top, values.shape[1])
    peak = _gather(group, values.amax(dim=-1)).amax(dim=0)
    has_candidate = peak > _NEG_INF
    shifted = values - torch.where(has_candidate, peak, 0.0).unsqueeze(-1)
    total = _gather(group, torch.exp(shifted).sum(dim=-1)).sum(dim=0)  # rank order
    logprobs = torch.where(has_candidate.unsqueeze(-1), shifted - torch.log(total).unsqueeze(-1), _NEG_INF)
    holds = (tokens >= ids[0]) & (tokens <= ids[-1])
    column = torch.where(holds, tokens - ids[0], 0).unsqueeze(-1)
    chosen = torch.where(holds, logprobs.gather(1, column).squeeze(-1), _NEG_INF)
    top, top_index = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    local = torch.cat((chosen.unsqueeze(-1), top[:, :offered], ids[top_index[:, :offered]].to(torch.float64)), dim=-1)
    out = _gather(group, local)
    candidates = out[..., 1:1 + offered].permute(1, 0, 2).reshape(rows, -1)  # rank-major: ids ascending on ties
    candidate_ids = out[..., 1 + offered:].permute(1, 0, 2).reshape(rows, -1).to(torch.int64)
    order = torch.sort(candidates, dim=-1, descending=True, stable=True).indices[:, :num_top]
    chosen = torch.where(tokens >= 0, out[..., 0].amax(dim=0), _NEG_INF)
    return chosen.to(torch.float32), candidate_ids.gather(1, order), candidates.gather(1, order).to(torch.float32)


@abi_op(_SAMPLE, mutates_args=(), schema=SAMPLE_SHARD_SCHEMA)
def sample_vocab_shard(logits: torch.Tensor, vocab_start: torch.Tensor, vocab_size: int, seeds: torch.Tensor,
                       counters: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       min_p: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
                       output_counts: torch.Tensor, grammar_mask: torch.Tensor, mask_rows: torch.Tensor,
                       ranks: int) -> torch.Tensor:
    _sample_fake(logits, vocab_start, vocab_size, seeds, counters, temperature, top_k, top_p, min_p, penalties,
                 prompt_counts, output_counts, grammar_mask, mask_rows, ranks)  # its argument checks
    raise CollectiveError(f"{_SAMPLE}: no rank group is bound to this program (a tensor-parallel program ran "
                          "alone; bind it with bind_collectives)")


@sample_vocab_shard.register_fake
def _sample_fake(logits, vocab_start, vocab_size, seeds, counters, temperature, top_k, top_p, min_p, penalties,
                 prompt_counts, output_counts, grammar_mask, mask_rows, ranks):
    params = DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
    rows, _ = check_sample_shard_args(logits, vocab_start, vocab_size, params, penalties,
                                      (prompt_counts, output_counts), grammar_mask, mask_rows, ranks)
    return logits.new_empty((rows,), dtype=torch.int64)


@abi_op(_LOGPROBS, mutates_args=(), schema=LOGPROBS_SHARD_SCHEMA)
def token_logprobs_vocab_shard(logits: torch.Tensor, vocab_start: torch.Tensor, vocab_size: int,
                               tokens: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
                               output_counts: torch.Tensor, grammar_mask: torch.Tensor, mask_rows: torch.Tensor,
                               num_top: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _logprobs_fake(logits, vocab_start, vocab_size, tokens, penalties, prompt_counts, output_counts, grammar_mask,
                   mask_rows, num_top, ranks)  # its argument checks
    raise CollectiveError(f"{_LOGPROBS}: no rank group is bound to this program (a tensor-parallel program ran "
                          "alone; bind it with bind_collectives)")


@token_logprobs_vocab_shard.register_fake
def _logprobs_fake(logits, vocab_start, vocab_size, tokens, penalties, prompt_counts, output_counts, grammar_mask,
                   mask_rows, num_top, ranks):
    rows, _ = check_logprobs_shard_args(logits, vocab_start, vocab_size, tokens, penalties,
                                        (prompt_counts, output_counts), grammar_mask, mask_rows, num_top, ranks)
    return (logits.new_empty((rows,)), logits.new_empty((rows, num_top), dtype=torch.int64),
            logits.new_empty((rows, num_top)))


register_group_op(sample_vocab_shard, lambda group: ShardedSampling(group).sample)
register_group_op(token_logprobs_vocab_shard, lambda group: ShardedSampling(group).token_logprobs)

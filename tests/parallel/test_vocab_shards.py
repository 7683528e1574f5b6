"""Vocabulary-sharded sampling and the fused residual all-reduce on two gloo ranks (threads of this
process): every rank returns, bit for bit, what one rank computes from the whole vocabulary."""

from __future__ import annotations

import pytest
import torch

from helios.abi import sampling
from helios.abi.collectives import CollectiveError
from helios.abi.fused import reference_add_rms_norm
from helios.abi.reduce_norm import GroupResidualNorm
from helios.abi.registry import AbiArgumentError
from helios.abi.sampling import SampleVariant, sample_reference
from helios.abi.token_logprobs import MAX_TOP, logprobs_reference
from helios.abi.vocab_shards import ShardedSampling

from support.shard_sampling import RANKS, ROWS, SHARD, VOCAB, residual_inputs, row_inputs, shard_of

from .test_collectives import on_ranks

def reference_tokens(args: dict, draws: bool = True) -> torch.Tensor:
    params = sampling.DrawParams(*(args[name] for name in sampling.DrawParams._fields))
    return sample_reference(args["logits"], params, args["penalties"], (args["prompt_counts"], args["output_counts"]),
                            args["grammar_mask"], args["mask_rows"], draws)


def sharded_tokens(args: dict, variant: SampleVariant = SampleVariant.FULL) -> list:
    def work(rank, group):
        logits, start = shard_of(args["logits"], rank)
        rest = [args[name] for name in (*sampling.DrawParams._fields, "penalties", "prompt_counts", "output_counts",
                                        "grammar_mask", "mask_rows")]
        return ShardedSampling(group, variant).sample(logits, start, VOCAB, *rest, RANKS)

    return on_ranks(work)


@pytest.mark.parametrize("selects", [True, False], ids=["cpu-path", "device-path"])
def test_sharded_sampling_draws_the_single_rank_tokens_bit_for_bit(monkeypatch, selects):
    """Greedy, drawing, penalised, masked and all-masked rows; on the device path (no host read:
    every call that may draw gathers the rows) too."""
    monkeypatch.setattr(sampling, "selective", lambda device: selects)
    monkeypatch.setattr("helios.abi.vocab_shards.selective", lambda device: selects)
    args = row_inputs()
    expected = reference_tokens(args)
    assert expected[5] == sampling.NO_TOKEN and expected[0] == 5
    for tokens in sharded_tokens(args):
        assert isinstance(tokens, torch.Tensor), tokens
        assert torch.equal(tokens, expected)


def test_greedy_steps_exchange_only_the_winners_and_match_the_argmax(monkeypatch):
    args = row_inputs(seed=1)
    gathered = []
    monkeypatch.setattr("helios.abi.vocab_shards._gathered", lambda *a: gathered.append(a) or None)
    greedy = dict(args, temperature=torch.zeros(ROWS))
    for tokens in sharded_tokens(greedy):  # the full binding: nothing draws, so nothing is gathered
        assert torch.equal(tokens, reference_tokens(greedy))
    for tokens in sharded_tokens(args, SampleVariant.GREEDY):  # the greedy binding never draws
        assert torch.equal(tokens, reference_tokens(args, draws=False))
    assert gathered == []
    plain = dict(greedy, penalties=torch.tensor([[1.0, 0.0, 0.0]] * ROWS), grammar_mask=torch.full_like(
        args["grammar_mask"], -1))  # the float32 fast path
    for tokens in sharded_tokens(plain):
        assert torch.equal(tokens, reference_tokens(plain))


def test_sharded_logprobs_agree_with_the_whole_vocabulary():
    args = row_inputs(seed=2)
    tokens = reference_tokens(args)
    counts = (args["prompt_counts"], args["output_counts"])
    names = ("penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows")
    chosen, top_ids, top = logprobs_reference(args["logits"], tokens, args["penalties"], *counts,
                                              args["grammar_mask"], args["mask_rows"], 5)

    def work(rank, group):
        logits, start = shard_of(args["logits"], rank)
        return ShardedSampling(group).token_logprobs(logits, start, VOCAB, tokens, *(args[n] for n in names), 5, RANKS)

    for result in on_ranks(work):
        assert isinstance(result, tuple), result
        mine_chosen, mine_ids, mine_top = result
        assert torch.equal(mine_ids, top_ids)
        assert torch.allclose(mine_chosen, chosen, atol=1e-6, rtol=0, equal_nan=True)
        assert torch.equal(mine_chosen.isinf(), chosen.isinf())
        assert torch.allclose(mine_top, top, atol=1e-6, rtol=0)
        assert torch.equal(mine_top.isinf(), top.isinf())


def test_sharded_logprobs_take_more_alternatives_than_a_shard_holds():
    """A program returns `MAX_TOP` alternatives whenever the vocabulary holds them, however few
    columns a rank's shard has (29 ids on 2 ranks: shards of 15, the last padded): a core of such
    a vocabulary failed to prepare (the op refused 20 alternatives from a shard of 15). Rows that
    allow fewer tokens than asked fill with -inf in id order, as the whole row does."""
    vocab, num_top = 29, MAX_TOP
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(3)) * 3
    penalties = torch.tensor([[1.0, 0.0, 0.0], [1.2, 0.3, 0.1], [1.0, 0.0, 0.0]])
    counts = torch.randint(0, 3, (2, 3, vocab), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    grammar_mask = torch.full((3, 1), -1, dtype=torch.int32)
    grammar_mask[2] = 0x00030F01  # 7 allowed ids, on both shards: 13 alternatives are -inf
    args = (penalties, counts[0], counts[1], grammar_mask, torch.ones(3, dtype=torch.bool))
    tokens = torch.tensor([4, 20, 16])
    chosen, top_ids, top = logprobs_reference(logits, tokens, *args, num_top)

    def work(rank, group):
        shard, start = shard_of(logits, rank)
        return ShardedSampling(group).token_logprobs(shard, start, vocab, tokens, *args, num_top, RANKS)

    for result in on_ranks(work):
        assert isinstance(result, tuple), result
        mine_chosen, mine_ids, mine_top = result
        assert torch.equal(mine_ids, top_ids)
        assert torch.allclose(mine_chosen, chosen, atol=1e-6, rtol=0)
        assert torch.allclose(mine_top, top, atol=1e-6, rtol=0) and torch.equal(mine_top.isinf(), top.isinf())
    assert top[2].isinf().sum() == num_top - 7


def test_sharded_ops_refuse_bad_inputs_and_run_only_bound():
    args = row_inputs()
    logits, start = shard_of(args["logits"], 0)
    rest = [args[name] for name in (*sampling.DrawParams._fields, "penalties", "prompt_counts", "output_counts",
                                    "grammar_mask", "mask_rows")]
    with pytest.raises(CollectiveError, match="no rank group"):
        torch.ops.helios.sample_vocab_shard(logits, start, VOCAB, *rest, RANKS)

    def work(rank, group):
        bound = ShardedSampling(group)
        errors = []
        for call in (lambda: bound.sample(logits.double(), start, VOCAB, *rest, RANKS),
                     lambda: bound.sample(logits, start.int(), VOCAB, *rest, RANKS),
                     lambda: bound.sample(logits, start, SHARD * RANKS + 1, *rest, RANKS),
                     lambda: bound.sample(logits, start, VOCAB, *rest, 4),
                     lambda: bound.sample(logits, start, VOCAB, *rest[:-3], rest[-3][:, :5], *rest[-2:], RANKS),
                     lambda: bound.token_logprobs(logits, start, VOCAB, args["seeds"], *rest[6:], SHARD + 1, RANKS)):
            with pytest.raises(AbiArgumentError):
                call()
            errors.append(True)
        return errors

    assert on_ranks(work) == [[True] * 6] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_residual_all_reduce_is_the_unfused_sequence_bit_for_bit(dtype):
    inputs = [tuple(t.to(dtype) for t in residual_inputs(rank)) for rank in range(RANKS)]
    x, weight, partials = inputs[0][0], inputs[0][2], [partial for _, partial, _ in inputs]
    expected = reference_add_rms_norm(x, partials[0] + partials[1], weight, 1e-6)

    def work(rank, group):
        return GroupResidualNorm(group).all_reduce_add_rms_norm(x, partials[rank], weight, 1e-6, RANKS)

    for summed, normed in on_ranks(work):
        assert torch.equal(summed, expected[0]) and torch.equal(normed, expected[1])
    with pytest.raises(CollectiveError, match="no rank group"):
        torch.ops.helios.all_reduce_add_rms_norm(x, partials[0], weight, 1e-6, RANKS)
    with pytest.raises(AbiArgumentError):
        torch.ops.helios.all_reduce_add_rms_norm(x, partials[0][:, :3], weight, 1e-6, RANKS)

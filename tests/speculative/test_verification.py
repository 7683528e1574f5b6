"""Sampling weights, weighted draws and proposal verification (``helios::verify_proposals``).

The statistical tests draw tens of thousands of lanes in one vectorised call each: with N = 40,000
samples a frequency's standard error is at most 0.0025, so the 0.01 tolerance is four standard
errors and a 2% deviation in any token's probability fails.
"""

from __future__ import annotations

import pytest
import torch

from helios.abi.registry import AbiArgumentError
from helios.abi.rng import SAMPLE_OFFSET
from helios.abi.sampling import split_sampling_parameters

OPS = torch.ops.helios
SAMPLES = 40_000
TOLERANCE = 0.01


def random_rows(rows: int, vocab: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    params = torch.zeros(rows, 7)
    params[:, 0] = torch.rand(rows, generator=generator) * 2 - 0.3  # some greedy rows
    params[:, 1] = torch.randint(0, 10, (rows,), generator=generator).float()
    params[:, 2] = torch.rand(rows, generator=generator) * 0.5 + 0.5
    params[:, 3] = torch.rand(rows, generator=generator) * 0.2
    params[:, 4:7] = torch.rand(rows, 3, generator=generator) + torch.tensor([1.0, 0.0, 0.0])
    counts = [torch.randint(0, 3, (rows, vocab), generator=generator, dtype=torch.int32) for _ in range(2)]
    mask = torch.randint(-2**31, 2**31 - 1, (rows, -(-vocab // 32)), generator=generator, dtype=torch.int32)
    mask_rows = torch.rand(rows, generator=generator) < 0.3
    mask[:10], mask_rows[:10] = 0, True  # rows whose grammar allows nothing
    seeds = torch.randint(0, 2**62, (rows,), generator=generator)
    counters = torch.randint(0, 10_000, (rows,), generator=generator)
    return logits, split_sampling_parameters(params), counts, mask, mask_rows, seeds, counters


def test_draws_from_sampling_weights_equal_helios_sample_bit_for_bit():
    logits, (t, k, p, m, pen), counts, mask, mask_rows, seeds, counters = random_rows(3000, 70, seed=1)
    sampled = OPS.sample(logits, seeds, counters, t, k, p, m, pen, counts[0], counts[1], mask, mask_rows)
    weights = OPS.sampling_weights(logits, t, k, p, m, pen, counts[0], counts[1], mask, mask_rows)
    assert weights.dtype == torch.float64 and bool((weights >= 0).all())
    drawn = OPS.draw_weighted(weights, seeds, counters, SAMPLE_OFFSET)
    assert torch.equal(sampled, drawn)
    assert bool((sampled == -1).any())  # some masked rows allow nothing: both give NO_TOKEN
    greedy = ~(t > 0)
    assert torch.equal((weights[greedy] > 0).sum(-1), (sampled[greedy] >= 0).long())  # one-hot or empty


def one_hot(tokens, vocab):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).to(torch.float64)


def verify(target, proposals, proposal_weights, lengths, seeds=None, counters=None):
    rows = target.shape[0]
    seeds = torch.arange(rows) if seeds is None else seeds
    counters = torch.full((rows,), 100) if counters is None else counters
    emitted, accepted = OPS.verify_proposals(target, torch.tensor(proposals), proposal_weights,
                                             torch.tensor(lengths), seeds, counters)
    return emitted.tolist(), accepted.tolist()


def test_greedy_lanes_keep_the_longest_matching_prefix():
    vocab, argmax = 10, [[3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6]]
    target = torch.stack([one_hot(row, vocab) for row in argmax])  # [5, W=4, V]
    proposals = [[3, 4, 5], [3, 9, 5], [7, 4, 5], [3, 4, 5], [3, 4, 5]]
    weights = torch.stack([one_hot(row, vocab) for row in proposals])
    emitted, accepted = verify(target, proposals, weights, [4, 4, 4, 2, 0])
    assert accepted == [3, 1, 0, 1, 0]
    assert emitted == [[3, 4, 5, 6], [3, 4, -1, -1], [3, -1, -1, -1], [3, 4, -1, -1], [-1, -1, -1, -1]]


def test_a_proposal_the_target_cannot_emit_is_always_rejected():
    vocab, rows = 6, 2000
    target = torch.full((rows, 2, vocab), 1.0, dtype=torch.float64)
    target[:, 0, 2] = 0.0  # token 2 is impossible at position 0
    weights = torch.zeros(rows, 1, vocab, dtype=torch.float64)
    weights[:, 0, 2] = 1.0  # ... but it is what was proposed
    emitted, accepted = verify(target, [[2]] * rows, weights, [2] * rows)
    assert set(accepted) == {0}
    assert all(row[0] != 2 and row[0] >= 0 and row[1] == -1 for row in emitted)


def test_a_lane_without_allowed_tokens_emits_no_token():
    target = torch.zeros(1, 2, 4, dtype=torch.float64)
    emitted, accepted = verify(target, [[1]], one_hot([[1]], 4), [2])
    assert (emitted, accepted) == ([[-1, -1]], [0])


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).to(torch.float64) / tokens.numel()


@pytest.fixture(scope="module")
def distributions():
    generator = torch.Generator().manual_seed(5)
    vocab = 8
    p = torch.softmax(torch.randn(vocab, generator=generator, dtype=torch.float64) * 1.2, 0)
    q = torch.softmax(torch.randn(vocab, generator=generator, dtype=torch.float64) * 1.2, 0)
    assert (p - q).abs().max() > 0.05  # emitting proposals unchecked would fail the test
    return p, q


@pytest.mark.parametrize("proposal", ["drafted", "copied", "none"])
def test_emitted_tokens_follow_the_target_distribution(distributions, proposal):
    p, q = distributions
    vocab, rows = p.shape[0], SAMPLES
    seeds, counters = torch.arange(rows) * 7919 + 3, torch.full((rows,), 50)
    target = p.expand(rows, 2, vocab).contiguous()
    if proposal == "copied":  # a point mass on one fixed candidate
        drafted = torch.full((rows,), 2)
        weights = one_hot([2] * rows, vocab).unsqueeze(1)
    else:
        weights = q.expand(rows, 1, vocab).contiguous()
        drafted = OPS.draw_weighted(weights[:, 0], seeds, counters, SAMPLE_OFFSET)
    lengths = [1 if proposal == "none" else 2] * rows
    emitted, accepted = OPS.verify_proposals(target, drafted.unsqueeze(1), weights, torch.tensor(lengths),
                                             seeds, counters)
    first = emitted[:, 0]
    assert bool((first >= 0).all())
    assert (frequencies(first, vocab) - p).abs().max() < TOLERANCE
    if proposal != "none":
        assert 0 < accepted.sum() < rows  # both acceptance and rejection happen
        rate = accepted.double().mean()
        expected = torch.minimum(p, q).sum() if proposal == "drafted" else p[2]
        assert abs(rate - expected) < TOLERANCE


def test_argument_checks():
    target = torch.zeros(2, 3, 5, dtype=torch.float64)
    good = dict(proposals=torch.zeros(2, 2, dtype=torch.int64),
                proposal_weights=torch.zeros(2, 2, 5, dtype=torch.float64),
                lengths=torch.ones(2, dtype=torch.int64), seeds=torch.zeros(2, dtype=torch.int64),
                counters=torch.zeros(2, dtype=torch.int64))
    OPS.verify_proposals(target, *good.values())
    for name, bad in (("proposal_weights", torch.zeros(2, 2, 4, dtype=torch.float64)),
                      ("lengths", torch.ones(2, dtype=torch.int32)),
                      ("proposals", torch.zeros(3, 2, dtype=torch.int64))):
        with pytest.raises(AbiArgumentError):
            OPS.verify_proposals(target, *{**good, name: bad}.values())
    with pytest.raises(AbiArgumentError):
        OPS.draw_weighted(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 0)

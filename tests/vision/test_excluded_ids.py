"""Declared non-sampled ids (vocabulary.excluded_ids, e.g. an image sentinel inside the sampled
range): the contract accepts a sentinel there only when it is excluded, and the packer's mask rows
clear it, so the sampler never returns it, greedy or random, constrained or not."""

from __future__ import annotations

import pytest
import torch

import helios.abi.sampling  # noqa: F401  (registers helios::sample)
from helios.abi.sampling import split_sampling_parameters
from helios.contract import serving_pb2 as spb
from helios.runtime.execution.masks import allowed_row, write_masks as _write_masks

VOCAB = 100
EXCLUDED = (31, 32, 63, 99)


def _vocabulary(excluded=EXCLUDED) -> spb.VocabularyContract:
    vocab = spb.VocabularyContract(histogram_bins=VOCAB, mask_words=-(-VOCAB // 32), excluded_ids=list(excluded))
    vocab.sampled.end = VOCAB
    return vocab


def _bits(row: torch.Tensor) -> list[int]:
    return [t for t in range(VOCAB) if (int(row[t // 32]) >> (t % 32)) & 1]


def test_allowed_row_clears_exactly_the_excluded_ids():
    row = allowed_row(_vocabulary())
    assert row.dtype == torch.int32 and row.shape == (4,)
    assert _bits(row) == [t for t in range(VOCAB) if t not in EXCLUDED]
    assert allowed_row(_vocabulary(())) is None


class _Row:
    def __init__(self, request_id, constrained):
        self.request_id, self.constrained = request_id, constrained


def test_mask_rows_intersect_grammar_masks_with_the_allowed_row():
    allowed = allowed_row(_vocabulary())
    target = torch.zeros((3, 4), dtype=torch.int32)
    grammar = torch.full((4,), -1, dtype=torch.int32)
    grammar[0] = -(1 << 31) | 1  # ids 0 and 31 (31 is excluded)
    grammar[1:] = 0
    _write_masks(target, [_Row("a", False), _Row("b", True)], {"b": grammar}, pad=True, allowed=allowed)
    assert _bits(target[0]) == _bits(allowed) and _bits(target[2]) == _bits(allowed)
    assert _bits(target[1]) == [0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_never_returns_an_excluded_id(temperature):
    rows = 64
    logits = torch.zeros((rows, VOCAB))
    logits[:, 63] = 50.0  # the excluded id dominates
    logits[:, 7] = 10.0
    params = torch.tensor([[temperature, 0, 1.0, 0.0, 1.0, 0.0, 0.0]] * rows, dtype=torch.float32)
    temp, top_k, top_p, min_p, penalties = split_sampling_parameters(params)
    mask = allowed_row(_vocabulary()).expand(rows, -1).contiguous()
    counts = torch.zeros((rows, VOCAB), dtype=torch.int32)
    sampled = torch.ops.helios.sample(logits, torch.arange(rows), torch.zeros(rows, dtype=torch.int64), temp, top_k,
                                      top_p, min_p, penalties, counts, counts, mask, torch.ones(rows, dtype=torch.bool))
    assert not set(sampled.tolist()) & set(EXCLUDED)
    if temperature == 0.0:
        assert set(sampled.tolist()) == {7}

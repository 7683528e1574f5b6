"""The CUDA greedy path of ``helios::sample_vocab_shard``: a shard's best (value, id) from the fused
greedy pass of ``helios::sample`` on views of the counts and mask words equals, bit for bit, the
best of the shard's values as the CPU path forms them (penalties, grammar masks, NaN, infinities,
rows that allow nothing in the shard). Without CUDA the kernel runs under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi.vocab_shards import kernel_fits, shard_best_kernel, shard_ids, shard_values  # noqa: E402
from support.abi_inputs import sample_inputs  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
VOCAB, SHARD = 4096, 2048


@pytest.mark.parametrize("rank, seed", [(0, 0), (1, 1), (1, 2)])
def test_the_kernel_finds_the_shards_best_value_and_lowest_id(rank, seed):
    inputs = {name: value.to(DEVICE) for name, value in sample_inputs(7, VOCAB, seed).items()}
    start = rank * SHARD
    logits = inputs["logits"][:, start:start + SHARD].contiguous()
    logits[3, 100] = logits[3, 900] = 1e4  # a tie inside the shard: the lower id wins
    counts = (inputs["prompt_counts"], inputs["output_counts"])
    rest = (inputs["penalties"], counts, inputs["grammar_mask"], inputs["mask_rows"])
    best, ids = shard_best_kernel(logits, start, *rest)
    ids_of = shard_ids(torch.tensor([start], device=DEVICE), SHARD)
    values = shard_values(logits, ids_of, VOCAB, *rest)
    expected_best, index = values.max(dim=-1)
    found = expected_best > float("-inf")
    assert torch.equal(best.cpu(), expected_best.cpu())
    assert torch.equal(ids[found].cpu(), ids_of[index][found].cpu())
    assert not bool(found.all())  # some row allows nothing in this shard (its best is -inf)


def test_the_kernel_takes_word_aligned_shards_without_padding_only():
    assert kernel_fits(64128, 64128, 128256) and kernel_fits(0, 75968, 151936)
    assert not kernel_fits(39, 39, 77) and not kernel_fits(32, 32, 60) and not kernel_fits(0, 48, 96)

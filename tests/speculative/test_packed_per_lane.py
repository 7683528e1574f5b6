"""Exact-length SPECULATIVE programs prepared with fewer packed positions than B x W
(`helios prepare --packed-per-lane N` without `--allocate-prefixes`): the scheduler gives a round's
lanes no more tokens than the chosen program's P, so a lone decoding lane (the B = 1 program, P = N)
speculates within it instead of failing its request, and the output is ordinary decoding's."""

from __future__ import annotations

import pytest

from helios.ignition.recipes import load_checkpoint
from ignition.hf_checkpoints import LLAMA3, random_model, write_checkpoint

from .test_equivalence import plan, run


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3), tmp_path_factory.mktemp("llama3")))


@pytest.mark.parametrize("per_lane", [1, 2])
def test_exact_length_lanes_fit_a_packed_capacity_below_the_width(recipe, per_lane):
    prompts = [[5, 9, 17, 3, 44, 2, 8]]  # one lane: the B = 1 program holds P = per_lane positions
    expected, _ = run(recipe, recipe, plan(), speculative=False, prompts=prompts)
    tokens, counting = run(recipe, recipe, plan((3,), per_lane=per_lane), prompts=prompts)
    assert tokens == expected
    assert counting.rounds > 0
    assert counting.tokens_per_lane <= per_lane and (per_lane == 1 or counting.tokens_per_lane > 1)

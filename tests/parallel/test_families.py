"""Two tensor-parallel ranks give the same greedy tokens as one rank, for every recipe family,
through the runtime API (ranks as threads of this process: the same code path as processes, which
`test_generate_cli` covers)."""

from __future__ import annotations

import pytest

from ignition.hf_checkpoints import DENSE_FAMILIES, GLM4_MOE, GPT_OSS, QWEN3_MOE

# Mixtral's experts are cut by the same code as Qwen3-MoE's (tests/parallel/test_moe_sharding.py covers
# the cut itself); GLM-4.5 adds shared experts, dense first layers and partial rotary; gpt-oss attention
# sinks (split by query head) and expert biases (the down bias added once).
FAMILIES = DENSE_FAMILIES + (QWEN3_MOE, GLM4_MOE, GPT_OSS)

from .conftest import greedy_tokens


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_two_ranks_generate_what_one_rank_generates(cores, family):
    two = greedy_tokens(cores.open(cores.core(family, 2)))
    assert two == cores.one_rank_tokens(family)
    assert all(len(tokens) == 10 for tokens in two)

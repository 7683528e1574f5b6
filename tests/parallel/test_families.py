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


def test_two_ranks_with_weights_in_parts_generate_what_one_rank_generates(cores, monkeypatch, tmp_path):
    """Each rank's weights cut into several resources: rank 1 finds its parts by position."""
    import helios.ignition.sharding as sharding
    from helios.cli.main import main

    from .conftest import NAMESPACE

    family = DENSE_FAMILIES[0]
    monkeypatch.setattr(sharding, "WEIGHT_PART_NBYTES", 32 * 1024)
    path = tmp_path / "parts-tp2.core"
    assert main(["prepare", str(cores.checkpoint(family)), "-o", str(path), "--key", str(cores.key),
                 "--namespace", NAMESPACE, "--context-tokens", "64", "--prefill-tokens", "16",
                 "--decode-batches", "2", "--no-mixed", "--tensor-parallel", "2"]) == 0
    core = cores.open(path)
    parts = [info for info in core.resources if info.kind.name == "WEIGHTS"]
    assert len([p for p in parts if p.rank == 1]) == len([p for p in parts if p.rank == 0]) > 2
    assert greedy_tokens(core) == cores.one_rank_tokens(family)

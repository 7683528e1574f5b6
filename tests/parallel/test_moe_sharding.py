"""Tensor-parallel cuts of mixture-of-experts layers: each expert's width is split, and the ranks'
partial expert outputs sum to the whole layer's output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import Architecture, CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.decoder import moe_block
from helios.ignition.recipes.base import NamedWeight, Recipe
from helios.ignition.sharding import rank_architecture, rank_weights

MOE = MixtureOfExperts(num_experts=4, experts_per_token=2, expert_intermediate_size=6, sparse_layers=(1,),
                       scoring="sigmoid", num_groups=2, topk_groups=1, scale=2.0, correction_bias=True,
                       router_bias=True, expert_bias=True, activation="swiglu_clamped", alpha=1.7, limit=0.8,
                       shared_intermediate_size=4)
ARCH = Architecture(vocab_size=11, hidden_size=8, intermediate_size=6, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=2, rms_norm_eps=1e-5, layer_windows=(0, 0), moe=MOE)


def random_recipe(arch: Architecture = ARCH) -> Recipe:
    generator = torch.Generator().manual_seed(0)
    weights = [NamedWeight(slot.name, torch.randn(slot.shape, generator=generator).to(getattr(torch, slot.dtype)))
               for slot in weight_layout(arch)]
    return Recipe("random", arch, tuple(weights))


def test_rank_architecture_divides_expert_widths():
    shard = rank_architecture(ARCH, 2)
    assert (shard.moe.expert_intermediate_size, shard.moe.shared_intermediate_size) == (3, 2)
    assert shard.moe.num_experts == 4 and shard.intermediate_size == 3


def test_uneven_expert_widths_are_refused_by_name():
    width = "expert width \\(moe_intermediate_size; Mixtral's and gpt-oss's intermediate_size\\) 6"
    with pytest.raises(CheckpointError, match=width):
        rank_architecture(dataclasses.replace(ARCH, intermediate_size=4), 4)
    odd_shared = dataclasses.replace(ARCH, moe=dataclasses.replace(MOE, shared_intermediate_size=3))
    with pytest.raises(CheckpointError, match="shared expert width \\(n_shared_experts x moe_intermediate_size, or "
                                             "shared_expert_intermediate_size / shared_intermediate_size\\) 3"):
        rank_architecture(odd_shared, 2)


def test_expert_shards_reassemble_and_the_down_bias_is_added_once():
    recipe = random_recipe()
    whole = {w.name: w.tensor for w in recipe.weights}
    ranks = [{w.name: w.tensor for w in rank_weights(recipe, 2, rank)} for rank in range(2)]
    gate_up = whole["layers.1.experts.gate_up"]
    assert torch.equal(torch.cat([r["layers.1.experts.gate_up"][:, :3] for r in ranks], dim=1), gate_up[:, :6])
    assert torch.equal(torch.cat([r["layers.1.experts.gate_up"][:, 3:] for r in ranks], dim=1), gate_up[:, 6:])
    assert torch.equal(torch.cat([r["layers.1.experts.down"] for r in ranks], dim=2), whole["layers.1.experts.down"])
    assert torch.equal(ranks[0]["layers.1.experts.down_bias"], whole["layers.1.experts.down_bias"])
    assert not ranks[1]["layers.1.experts.down_bias"].any()
    for name in ("router.weight", "router.bias", "router.correction_bias"):
        assert all(torch.equal(r[f"layers.1.{name}"], whole[f"layers.1.{name}"]) for r in ranks)


def test_partial_expert_outputs_sum_to_the_whole_layer():
    """Each rank's MoE block before the all-reduce; their sum is the one-rank block."""
    recipe = random_recipe()
    hidden = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    expected = moe_block(ARCH, {w.name: w.tensor for w in recipe.weights}, "layers.1.", hidden)
    shard = dataclasses.replace(rank_architecture(ARCH, 2), tensor_parallel=1)  # no collective: the partial sums
    partial = [moe_block(shard, {w.name: w.tensor for w in rank_weights(recipe, 2, rank)}, "layers.1.", hidden)
               for rank in range(2)]
    torch.testing.assert_close(partial[0] + partial[1], expected, rtol=1e-5, atol=1e-5)

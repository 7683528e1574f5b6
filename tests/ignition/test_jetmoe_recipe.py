"""The JetMoE recipe against transformers' JetMoeForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py JETMOE): a mixture of attention heads (4 experts of 2 query heads of 16
over 2 key/value heads, top-2 softmax routing, an output bias) and of gated experts (4, top-2, an output bias);
untied. The attention experts are prepared densely (every expert's heads attend; each token scales an expert's
heads by its routing weight, 0 where not chosen: `Architecture.attention_experts`). Prefill logits, scored
log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); the head weighting matters; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.decoder import expert_head_weights
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import JETMOE, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(JETMOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim) == (8, 2, 16)
    assert (arch.attention_experts, arch.attention_experts_per_token) == (4, 2) and arch.o_bias
    assert arch.moe.scoring == "topk_softmax" and arch.moe.expert_bias and arch.rms_norm_eps == 1e-6
    moa = prepared.reference.model.layers[1].self_attention.experts
    queries = moa.input_linear.weight  # [E, Hkv D, H]: expert 3's key/value head 1 is prepared head 1 * 4 + 3
    assert torch.equal(weights["layers.1.qkv.weight"][7 * 16:8 * 16], queries[3, 16:32])
    assert torch.equal(weights["layers.1.o.weight"][:, 7 * 16:8 * 16], moa.output_linear.weight[3][:, 16:32])
    bias = prepared.reference.model.layers[1].mlp.bias
    assert torch.equal(weights["layers.1.experts.down_bias"], bias.expand(4, -1))


def test_the_head_weighting_matters(prepared):
    """Without the routing weights every expert's heads would add up, chosen or not."""
    recipe = prepared.recipe
    unweighted = dataclasses.replace(recipe.architecture, attention_experts=0, attention_experts_per_token=0)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=unweighted,
                                      weights=equivalence.layout_tensors(recipe, unweighted))


def test_the_head_weights_are_capturable_and_sum_to_one_per_head_group(prepared):
    """`expert_head_weights` reads nothing on the host (CUDA graphs capture it) and gives each token top-k nonzero
    expert weights per key/value head, summing to 1."""
    from support.host_sync import forbid_host_sync

    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    hidden = torch.randn(5, arch.hidden_size, generator=torch.Generator().manual_seed(4))
    with forbid_host_sync():
        scales = expert_head_weights(arch, weights["layers.0.attn_router.weight"], hidden)
    per_expert = scales.reshape(5, arch.num_kv_heads, arch.attention_experts, arch.head_dim)[:, 0, :, 0]
    assert ((per_expert > 0).sum(-1) == 2).all() and torch.allclose(per_expert.sum(-1), torch.ones(5))


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("jetmoe-checkpoint"))


@pytest.mark.parametrize("change,message", [
    ({"activation_function": "gelu"}, "activation_function"),
    ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),
    ({"num_experts_per_tok": 5}, "5 experts per token of 4"),
    ({"kv_channels": None}, "kv_channels"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

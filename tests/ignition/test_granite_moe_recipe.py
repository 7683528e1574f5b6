"""The Granite MoE recipe against transformers' GraniteMoeForCausalLM and GraniteMoeSharedForCausalLM on
tiny random float32 checkpoints with every multiplier away from 1 (embedding 4, attention scale 0.2,
residual 0.5, logits divided by 2.5).

Two shapes (tests/ignition/hf_checkpoints.py): 6 experts, top-2, q/k/v/o biases, untied; 4 experts,
top-3, a shared expert, tied. Both weight each token's top-k logits by their softmax. Prefill logits,
scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); a served core of the shared variant does too; the fused expert
tensors are the stacked layout as stored, the residual multiplier folded into every block output's
projection; transformers' in-memory tensor names prepare the same weights; two ranks' blocks sum to
the one-rank block; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import (GRANITE_MOE, GRANITE_MOE_FAMILIES, GRANITE_MOE_SHARED, assert_refused, random_model,
                             rewritten_checkpoint, write_checkpoint)
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module", params=GRANITE_MOE_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_layout_folds_the_multipliers_into_the_stored_experts(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    layer = prepared.reference.model.layers[1]
    shared = prepared.family is GRANITE_MOE_SHARED
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == (MixtureOfExperts(4, 3, 32, (0, 1), scoring="topk_softmax", shared_intermediate_size=48)
                        if shared else MixtureOfExperts(6, 2, 32, (0, 1), scoring="topk_softmax"))
    assert arch.embedding_scale == 4.0 and arch.attention_scale == pytest.approx(0.2, rel=1e-15)
    assert arch.intermediate_size == 0 and arch.layer_windows == (0, 0) and arch.o_bias == (not shared)
    block = layer.block_sparse_moe
    assert torch.equal(weights["layers.1.router.weight"], block.router.weight)
    assert torch.equal(weights["layers.1.experts.gate_up"], block.experts.gate_up_proj)
    assert torch.equal(weights["layers.1.experts.down"], block.experts.down_proj * 0.5)
    assert torch.equal(weights["layers.1.o.weight"], layer.self_attn.o_proj.weight * 0.5)
    assert torch.equal(weights["final_norm"], prepared.reference.model.norm.weight / 2.5)
    if shared:
        assert torch.equal(weights["layers.1.shared.gate_up.weight"], layer.shared_mlp.input_linear.weight)
        assert torch.equal(weights["layers.1.shared.down.weight"], layer.shared_mlp.output_linear.weight * 0.5)


def test_two_ranks_sum_to_the_one_rank_block(prepared):
    from helios.ignition.decoder import moe_block
    from helios.ignition.sharding import rank_architecture, rank_weights

    recipe, whole = prepared.recipe, dict(prepared.recipe.weights)
    hidden = torch.randn(5, recipe.architecture.hidden_size, generator=torch.Generator().manual_seed(0))
    shard = rank_architecture(recipe.architecture, 2)
    total = sum(moe_block(shard, dict(rank_weights(recipe, 2, rank)), "layers.0.", hidden).value for rank in range(2))
    torch.testing.assert_close(total, moe_block(recipe.architecture, whole, "layers.0.", hidden))


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    """The shared variant (the plain one adds attention biases, which other families' cores serve)."""
    check_served_core(tmp_path, GRANITE_MOE_SHARED)


# ---------------------------------------------------------------------------------------------------
# config.json and tensor spellings, refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GRANITE_MOE, seed=4), tmp_path_factory.mktemp("granite-moe-checkpoint"))


def test_the_in_memory_tensor_names_prepare_the_same_weights(checkpoint, tmp_path):
    expected = dict(load_checkpoint(checkpoint).weights)
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: None)
    renames = {"block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.gate_up_proj",
               "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.down_proj",
               "block_sparse_moe.router.layer.weight": "block_sparse_moe.router.weight"}
    tensors = load_file(directory / "model.safetensors")
    renamed = {}
    for name, tensor in tensors.items():
        for old, new in renames.items():
            name = name.replace(old, new)
        renamed[name] = tensor
    assert renamed.keys() != tensors.keys()
    save_file(renamed, directory / "model.safetensors")
    weights = dict(load_checkpoint(directory).weights)
    assert weights.keys() == expected.keys() and all(torch.equal(weights[n], expected[n]) for n in weights)


def test_a_window_the_reference_does_not_read_is_ignored(checkpoint, tmp_path):
    def edit(config):
        config.update(sliding_window=4, layer_types=["sliding_attention"] * 2)

    assert load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).architecture.layer_windows == (0, 0)


REFUSED = {
    "a zero embedding multiplier": (dict(embedding_multiplier=0.0), "embedding_multiplier"),
    "a zero logits divisor": (dict(logits_scaling=0), "logits_scaling"),
    "null head_dim": (dict(head_dim=None), "head_dim"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "too many experts per token": (dict(num_experts_per_tok=7), "7 experts per token of 6"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_granite_moe_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)

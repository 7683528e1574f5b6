"""The Qwen2-MoE recipe against transformers' Qwen2MoeForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py QWEN2_MOE): sparse, dense, sparse layers, 6 experts, top-2
without renormalisation, a shared expert whose output each token scales by sigmoid(shared_expert_gate),
q/k/v biases, the first layer sliding over 5 positions. Prefill logits, scored log-probabilities and
greedy tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's
checks and tolerances); a served core does too; the prepared layout holds the gate whole on each of two
ranks, whose sum is the one-rank block; layer kinds derive as Qwen2MoeConfig derives them; unsupported
settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import QWEN2_MOE, assert_refused, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(QWEN2_MOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout_holds_the_gated_shared_expert(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    block = prepared.reference.model.layers[2].mlp
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(6, 2, 32, (0, 2), normalize=False, shared_intermediate_size=48,
                                        shared_gate=True)
    assert arch.qkv_bias and not arch.o_bias and not arch.qk_norm and arch.layer_windows == (5, 0, 0)
    assert torch.equal(weights["layers.2.shared.gate"], block.shared_expert_gate.weight)
    assert torch.equal(weights["layers.2.shared.gate_up.weight"],
                       torch.cat([block.shared_expert.gate_proj.weight, block.shared_expert.up_proj.weight]))
    assert torch.equal(weights["layers.2.experts.gate_up"], block.experts.gate_up_proj)
    assert "layers.1.gate_up.weight" in weights and "layers.1.shared.gate" not in weights


def test_two_ranks_hold_the_gate_whole_and_sum_to_the_block(prepared):
    """The gate reads each token's whole input (every rank holds it): each rank scales its share of the
    shared expert by the same sigmoid, so the ranks' outputs sum to the one-rank block's."""
    from helios.ignition.decoder import moe_block
    from helios.ignition.sharding import rank_architecture, rank_weights

    recipe, whole = prepared.recipe, dict(prepared.recipe.weights)
    hidden = torch.randn(5, recipe.architecture.hidden_size, generator=torch.Generator().manual_seed(0))
    shard = rank_architecture(recipe.architecture, 2)
    total = torch.zeros_like(hidden)
    for rank in range(2):
        cut = dict(rank_weights(recipe, 2, rank))
        assert torch.equal(cut["layers.0.shared.gate"], whole["layers.0.shared.gate"])
        total += moe_block(shard, cut, "layers.0.", hidden).value
    torch.testing.assert_close(total, moe_block(recipe.architecture, whole, "layers.0.", hidden))


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, QWEN2_MOE)


def test_the_shared_gate_needs_a_shared_expert():
    with pytest.raises(CheckpointError, match="shared_gate"):
        MixtureOfExperts(4, 2, 8, (0,), shared_gate=True)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(QWEN2_MOE, seed=4), tmp_path_factory.mktemp("qwen2-moe-checkpoint"))


@pytest.mark.parametrize("changes, windows", [
    ({"use_sliding_window": True, "max_window_layers": 3}, (5, 0, 5)),
    ({"use_sliding_window": True, "max_window_layers": 1}, (5, 0, 0)),
    ({"use_sliding_window": False}, (0, 0, 0)),
])
def test_layer_kinds_derive_as_the_config_class_derives_them(checkpoint, tmp_path, changes, windows):
    """Without layer_types (Qwen1.5-MoE's config.json): every other layer below max_window_layers
    slides when use_sliding_window is set, as Qwen2MoeConfig resolves it."""
    def edit(config):
        config.pop("layer_types")
        config.update(changes)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    assert load_checkpoint(directory).architecture.layer_windows == windows


REFUSED = {
    "sliding layers without use_sliding_window": (dict(use_sliding_window=False, sliding_window=0), "layer_types"),
    "no shared expert": (dict(shared_expert_intermediate_size=0), "shared_expert_intermediate_size"),
    "biases it does not declare": (dict(qkv_bias=False), "qkv_bias"),
    "no sparse layers": (dict(mlp_only_layers=[0, 1, 2]), "mlp_only_layers"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                             "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_qwen2_moe_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting)


def test_the_shared_gate_is_the_only_new_slot(prepared):
    """Without the gate the layout is Qwen3-MoE's (other families' programs unchanged)."""
    arch = prepared.recipe.architecture
    ungated = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, shared_gate=False))
    assert [s.name for s in weight_layout(arch) if s not in weight_layout(ungated)] == [
        "layers.0.shared.gate", "layers.2.shared.gate"]

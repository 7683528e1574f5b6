"""The OLMoE recipe against transformers' OlmoeForCausalLM on tiny random float32 checkpoints.

Two shapes (tests/ignition/hf_checkpoints.py): as released (no biases, top-2 of 6 experts without
renormalisation, untied) and with q/k/v/o biases, renormalised top-3, one key/value head, tied
embeddings and linear rope. Both norm q and k over the whole projections and route every layer.
Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix
pages) equal the reference's (test_equivalence's checks and tolerances); a served core does too (with
HELIOS_FAMILY_SERVED_SWEEP=1); the prepared layout is the mixture's with whole-width q/k norms; two
ranks hold their heads' entries of those norms; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint
from support.sweeps import swept

from . import test_equivalence as equivalence
from .hf_checkpoints import (OLMOE, OLMOE_BIASED, OLMOE_FAMILIES, assert_refused, random_model, rewritten_checkpoint,
                             write_checkpoint)
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module", params=OLMOE_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_layout_is_the_mixture_with_whole_projection_qk_norms(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    block, attention = prepared.reference.model.layers[1].mlp, prepared.reference.model.layers[1].self_attn
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    biased = prepared.family is OLMOE_BIASED
    assert arch.moe == MixtureOfExperts(6, 3 if biased else 2, 32, (0, 1), normalize=biased)
    assert arch.intermediate_size == 0 and arch.qk_norm_whole and arch.qkv_bias == arch.o_bias == biased
    assert torch.equal(weights["layers.1.q_norm"], attention.q_norm.weight)
    assert weights["layers.1.k_norm"].shape == (arch.kv_size,)
    assert torch.equal(weights["layers.1.experts.gate_up"], block.experts.gate_up_proj)
    assert torch.equal(weights["layers.1.router.weight"], block.gate.weight)


def test_two_ranks_hold_their_heads_entries_of_the_qk_norms(checkpoint):
    recipe = load_checkpoint(checkpoint)
    arch = recipe.architecture
    equivalence.assert_two_rank_shares(
        recipe, rows={"layers.0.q_norm": arch.q_size // 2, "layers.0.k_norm": arch.kv_size // 2},
        whole=("layers.0.router.weight",))


# HELIOS_FAMILY_SERVED_SWEEP: by default the C++ kernels serve OLMoE's switches through other families'
# cores: whole-projection q/k norms in test_minimax_m2_recipe's, a softmax top-k without renormalisation in
# test_qwen2_moe_recipe's.
if swept("HELIOS_FAMILY_SERVED_SWEEP"):
    def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
        check_served_core(tmp_path, OLMOE)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(OLMOE, seed=4), tmp_path_factory.mktemp("olmoe-checkpoint"))


def test_a_window_the_reference_does_not_read_is_ignored(checkpoint, tmp_path):
    def edit(config):
        config.update(sliding_window=4, use_sliding_window=True, layer_types=["sliding_attention"] * 2)

    assert load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).architecture.layer_windows == (0, 0)


REFUSED = {
    "clamped q/k/v": (dict(clip_qkv=8.0), "clip_qkv"),
    "another head width": (dict(head_dim=8), "head_dim"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                             "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "too many experts per token": (dict(num_experts_per_tok=7), "7 experts per token of 6"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_olmoe_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)

"""The MiniMax-M2 recipe against transformers' MiniMaxM2ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py MINIMAX_M2): q/k RMS norms over the whole projections before a
partial rotation (rotary_dim 8 of head_dim 16), and a mixture in every layer: 6 experts, top-2 of the sigmoid
scores plus a random correction bias, weighted by the scores renormalised; untied. Prefill logits, scored
log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); a served core does too; the prepared layout reorders the rotated
dimensions of q, k and their norms alike (the order matters); unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.moe import rotary_order

from . import test_equivalence as equivalence
from .hf_checkpoints import MINIMAX_M2, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(MINIMAX_M2)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout_reorders_q_k_and_their_whole_norms_alike(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(6, 2, 32, (0, 1), scoring="sigmoid", normalize=True, correction_bias=True)
    assert arch.intermediate_size == 0 and arch.qk_norm_whole and not arch.qk_norm_after_rotary
    order = rotary_order(16, 8)
    attention, block = prepared.reference.model.layers[1].self_attn, prepared.reference.model.layers[1].mlp
    assert torch.equal(weights["layers.1.q_norm"], attention.q_norm.weight.reshape(4, 16)[:, order].reshape(-1))
    assert torch.equal(weights["layers.1.router.correction_bias"], block.e_score_correction_bias)
    assert torch.equal(weights["rope.inv_freq"][4:], torch.zeros(4))  # the pass-through pairs


def test_the_rotary_order_matters(prepared):
    unordered = equivalence.with_checkpoint_qk_order(prepared.recipe, rotary_order(16, 8))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=12), weights=unordered)


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, MINIMAX_M2)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(MINIMAX_M2, seed=4), tmp_path_factory.mktemp("minimax-m2-checkpoint"))


def test_the_legacy_rotary_dim_sets_the_rotated_width(checkpoint, tmp_path):
    def edit(config):
        config.pop("rope_parameters")
        config.update(rope_theta=100.0, rotary_dim=4)

    weights = dict(load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).weights)
    assert torch.count_nonzero(weights["rope.inv_freq"]) == 2


REFUSED = {
    "no q/k norms": (None, "q_norm"),
    "an odd rotary width": (dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                                  "partial_rotary_factor": 0.1875}), "partial_rotary_factor"),
    "a rotary_dim past the head": (dict(rotary_dim=32, rope_parameters=None, rope_theta=100.0), "rotary_dim"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "another rope type": (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 100.0}), "rope_type"),
    "too many experts per token": (dict(num_experts_per_tok=7), "7 experts per token of 6"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_minimax_m2_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(changes or {}))
    if changes is None:  # a checkpoint without its q/k norm tensors
        from safetensors.torch import load_file, save_file

        path = directory / "model.safetensors"
        save_file({k: v for k, v in load_file(path).items() if "_norm.weight" not in k or "layernorm" in k}, path,
                  metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=setting):
        load_checkpoint(directory)

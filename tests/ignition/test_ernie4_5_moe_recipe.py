"""The Ernie 4.5 MoE recipe against transformers' Ernie4_5_MoeForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py ERNIE4_5_MOE): interleaved rotary pairs, a dense first layer
then two sparse ones: 6 experts chosen by their softmax plus a random correction bias (top-2, weighted by
the softmax renormalised) and one shared expert. Prefill logits, scored log-probabilities and greedy
tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); a served core does too; the prepared layout holds the correction bias [E] and the
de-interleaved q/k rows; the multi-token-prediction tensors are skipped; unsupported settings are refused
by name.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import ERNIE4_5_MOE, assert_refused, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(ERNIE4_5_MOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout_holds_the_choice_bias_and_deinterleaved_rows(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    layer = prepared.reference.model.layers[2]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(6, 2, 32, (1, 2), scoring="softmax", normalize=True, correction_bias=True,
                                        shared_intermediate_size=32)
    assert arch.intermediate_size == 96 and "layers.0.gate_up.weight" in weights
    bias = layer.mlp.gate.moe_statics.e_score_correction_bias
    assert torch.equal(weights["layers.2.router.correction_bias"], bias.reshape(-1)) and bias.abs().max() > 0
    q_rows = layer.self_attn.q_proj.weight[:16]  # the first head: even rows, then odd
    assert torch.equal(weights["layers.2.qkv.weight"][:16], torch.cat([q_rows[0::2], q_rows[1::2]]))


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, ERNIE4_5_MOE)


# ---------------------------------------------------------------------------------------------------
# config.json and tensor spellings, refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(ERNIE4_5_MOE, seed=4), tmp_path_factory.mktemp("ernie4_5-moe-checkpoint"))


def test_multi_token_prediction_tensors_are_skipped(checkpoint, tmp_path):
    expected = dict(load_checkpoint(checkpoint).weights)
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(num_nextn_predict_layers=1))
    tensors = load_file(directory / "model.safetensors")
    tensors["model.mtp_linear_proj.0.weight"] = torch.zeros(64, 128)
    save_file(tensors, directory / "model.safetensors")
    weights = dict(load_checkpoint(directory).weights)
    assert weights.keys() == expected.keys() and all(torch.equal(weights[n], expected[n]) for n in weights)


def test_the_last_layer_index_minus_one_is_the_last_layer(checkpoint, tmp_path):
    """Ernie4_5_MoeConfig resolves -1 (its default) to the last layer before saving; a hand-written
    config.json may hold it."""
    assert load_checkpoint(checkpoint).architecture.moe.sparse_layers == (1, 2)
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(moe_layer_end_index=-1))
    assert load_checkpoint(directory).architecture.moe.sparse_layers == (1, 2)


REFUSED = {
    "biases": (dict(use_bias=True), "use_bias"),
    "a binding norm floor": (dict(moe_norm_min=0.5), "moe_norm_min"),
    "no sparse layers": (dict(moe_layer_start_index=3), "moe_layer_start_index"),
    "no layer interval": (dict(moe_layer_interval=0), "moe_layer_interval"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                             "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "too many experts per token": (dict(moe_k=7), "7 experts per token of 6"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_ernie4_5_moe_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)

"""The FlexOlmo recipe against transformers' FlexOlmoForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py FLEX_OLMO): OLMo 2's block (no norm before the attention or the MLP,
their outputs normed before the residual adds, q/k norms over the whole projections) with q/k/v/o biases and a
mixture in every layer: 6 experts, top-2 of the softmax, renormalised; untied. Prefill logits, scored
log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); the MLP output norm cancels the renormalisation; a terse config.json takes FlexOlmoConfig's
defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.llama import rope_inv_freq

from . import test_equivalence as equivalence
from .hf_checkpoints import FLEX_OLMO, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(FLEX_OLMO)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.pre_norms and arch.sandwich_norms and arch.qk_norm_whole and arch.qkv_bias and arch.o_bias
    assert arch.moe == MixtureOfExperts(6, 2, 32, (0, 1), normalize=True) and arch.intermediate_size == 0
    layer = prepared.reference.model.layers[1]
    assert torch.equal(weights["layers.1.q_norm"], layer.self_attn.q_norm.weight)
    assert torch.equal(weights["layers.1.mlp_out_norm"], layer.post_feedforward_layernorm.weight)


def test_the_output_norm_follows_the_mixture(prepared):
    """The renormalisation scales each token's mixture output by one number, which post_feedforward_layernorm (the
    MLP output norm, after the mixture) cancels: served with or without it, the logits are the reference's."""
    arch, prompt = prepared.recipe.architecture, equivalence.random_prompt(13, seed=1)
    unnormalised = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, normalize=False))
    expected = equivalence.reference_last_logits(prepared, prompt)
    logits = equivalence.prefill_logits(unnormalised, prepared.recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < equivalence.TOLERANCE


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("flex-olmo-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """Rope settings, epsilon and normalisation left out are FlexOlmoConfig's: theta 500000, 1e-6, unnormalised."""
    def edit(config):
        for key in ("rope_parameters", "rms_norm_eps", "norm_topk_prob"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    recipe = load_checkpoint(directory)
    arch, weights = recipe.architecture, dict(recipe.weights)
    assert (arch.moe.normalize, arch.rms_norm_eps) == (reference.norm_topk_prob, reference.rms_norm_eps) == (False, 1e-6)
    assert reference.rope_parameters["rope_theta"] == 500_000.0
    assert torch.allclose(weights["rope.inv_freq"], rope_inv_freq({"rope_theta": 500_000.0}, 16))


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1000.0}}, "rope_type"),
    ({"num_experts_per_tok": 7}, "7 experts per token of 6"),
    ({"num_experts": None}, "num_experts"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

"""The Solar Open recipe against transformers' SolarOpenForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py SOLAR_OPEN): q/k/v biases, an unbiased o_proj, a mixture in every layer:
8 experts routed as DeepSeek-V3 routes (sigmoid scores with a random correction bias, 2 groups of which 1 is kept,
top-3 renormalised and scaled by 1.5) beside a shared MLP two experts wide; untied. Prefill logits, scored
log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); the routing groups and scale matter; GLM-4.5's keys the reference does
not read are not read; a terse config.json takes SolarOpenConfig's defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.llama import rope_inv_freq

from . import test_equivalence as equivalence
from .hf_checkpoints import SOLAR_OPEN, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(SOLAR_OPEN)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.qkv_bias and not arch.o_bias and not arch.qk_norm and arch.intermediate_size == 0
    assert (arch.moe.sparse_layers, arch.moe.scoring, arch.moe.num_groups, arch.moe.topk_groups, arch.moe.normalize,
            arch.moe.scale, arch.moe.shared_intermediate_size) == ((0, 1), "sigmoid", 2, 1, True, 1.5, 64)
    gate = prepared.reference.model.layers[1].mlp.gate
    assert torch.equal(weights["layers.1.router.correction_bias"], gate.e_score_correction_bias)


def test_the_routing_groups_and_scale_matter(prepared):
    arch = prepared.recipe.architecture
    ungrouped = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, num_groups=1, topk_groups=1))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=2), arch=ungrouped)
    unscaled = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, scale=1.0))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=3), arch=unscaled)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("solar-open-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """Rope settings, routing groups, scale and epsilon left out are SolarOpenConfig's: theta 1e6, one group, 1.0."""
    def edit(config):
        for key in ("rope_parameters", "n_group", "topk_group", "routed_scaling_factor", "rms_norm_eps"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    recipe = load_checkpoint(directory)
    arch, weights = recipe.architecture, dict(recipe.weights)
    assert (arch.moe.num_groups, arch.moe.scale, arch.rms_norm_eps) == (
        reference.n_group, reference.routed_scaling_factor, reference.rms_norm_eps)
    assert reference.rope_parameters["rope_theta"] == 1e6
    assert torch.allclose(weights["rope.inv_freq"], rope_inv_freq({"rope_theta": 1e6}, 16))


def test_glm_keys_the_reference_does_not_read_change_nothing(checkpoint, tmp_path):
    """SolarOpenModel puts the mixture in every layer and norms no q/k whatever these GLM-4.5 keys say."""
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(
        first_k_dense_replace=1, intermediate_size=7, use_qk_norm=True))
    assert load_checkpoint(directory).architecture.moe.sparse_layers == (0, 1)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1000.0}}, "rope_type"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"n_routed_experts": None}, "n_routed_experts"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

"""The Helium recipe against transformers' HeliumForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): interleaved rotary over whole heads, q/k/v and MLP biases, untied.
Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); the q/k rows' de-interleaved order matters; a terse
config.json takes HeliumConfig's defaults (its rope theta too); unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.glm4 import rotary_layout

from . import test_equivalence as equivalence
from .hf_checkpoints import HELIUM, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(HELIUM)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_de_interleaved_qk_order_matters(prepared):
    """The q/k rows in the checkpoint's order move the logits by more than ten times the tolerance."""
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    assert arch.qkv_bias and not arch.o_bias and arch.mlp_bias
    unordered = equivalence.with_checkpoint_qk_order(recipe, rotary_layout(arch.head_dim, arch.head_dim))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), weights=unordered)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(HELIUM, seed=4), tmp_path_factory.mktemp("helium-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """rms_norm_eps and the rope theta left out are HeliumConfig's 1e-8 and 100000 (Llama's fallbacks would be
    1e-6 and 10000)."""
    def edit(config):
        config.pop("rms_norm_eps")
        config["rope_parameters"].pop("rope_theta")

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory)
    recipe = load_checkpoint(directory)
    assert recipe.architecture.rms_norm_eps == reference.config.rms_norm_eps == 1e-8
    assert torch.equal(dict(recipe.weights)["rope.inv_freq"], reference.model.rotary_emb.inv_freq)
    assert reference.config.rope_parameters["rope_theta"] == 100_000.0


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "a partial rotary": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_helium_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

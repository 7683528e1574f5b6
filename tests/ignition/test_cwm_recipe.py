"""The Code World Model recipe against transformers' CwmForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py CWM): Llama with full, sliding, sliding layers over a window of 5
(shorter than the prompts) and a llama3-scaled rope, untied. Prefill logits, scored log-probabilities and greedy
tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); the windows matter; a terse config.json takes CwmConfig's defaults (its llama3 rope, every fourth layer
full); unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.llama import rope_inv_freq

from . import test_equivalence as equivalence
from .hf_checkpoints import CWM, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(CWM)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_sliding_layers_matter(prepared):
    arch = prepared.recipe.architecture
    assert arch.layer_windows == (0, 5, 5) and not arch.qkv_bias and not arch.o_bias
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1),
                                      arch=dataclasses.replace(arch, layer_windows=(0, 0, 0)))


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("cwm-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """Without rope_parameters (a legacy rope_theta is ignored), layer_types and the window: CwmConfig's."""
    def edit(config):
        for key in ("rope_parameters", "layer_types", "sliding_window", "rms_norm_eps"):
            config.pop(key)
        config["rope_theta"] = 77.0

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    recipe = load_checkpoint(directory)
    arch, weights = recipe.architecture, dict(recipe.weights)
    assert reference.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert arch.layer_windows == (0, 8192, 8192) and arch.rms_norm_eps == reference.rms_norm_eps
    expected = rope_inv_freq({"rope_parameters": reference.rope_parameters}, 16)
    assert reference.rope_parameters["rope_type"] == "llama3" and torch.allclose(weights["rope.inv_freq"], expected)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": None, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"sliding_window": 0}, "sliding_window"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

"""The OLMo v1 recipe against transformers' OlmoForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): LayerNorms without parameters, q/k/v clamped to +-0.8, q/k/v/o
biases, untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix
pages) equal the reference's (test_equivalence's checks and tolerances); the prepared norms are ones and the clamp
matters; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from . import test_equivalence as equivalence
from .hf_checkpoints import OLMO1, assert_refused, random_model, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(OLMO1)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_norms_are_ones_and_the_clamp_matters(prepared):
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    weights = dict(recipe.weights)
    assert arch.layer_norm and not arch.norm_bias and arch.qkv_clip == 0.8 and arch.rms_norm_eps == 1e-5
    assert all(torch.equal(weights[name], torch.ones(64)) for name in ("layers.1.input_norm", "final_norm"))
    unclamped = dataclasses.replace(arch, qkv_clip=0.0)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=unclamped)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(OLMO1, seed=4), tmp_path_factory.mktemp("olmo1-checkpoint"))


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "a zero clip": (lambda config: config.update(clip_qkv=0), "clip_qkv"),
    "a string clip": (lambda config: config.update(clip_qkv="8"), "clip_qkv"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_olmo1_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

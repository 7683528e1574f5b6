"""The nanochat recipe against transformers' NanoChatForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py NANOCHAT): RMS norms without parameters (the embeddings' before the
first layer too), NanoChat's reversed rotation, per-head q/k norms after it, the non-gated relu^2 MLP, the final
logits soft-capped at 3, untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from
cached prefix pages) equal the reference's (test_equivalence's checks and tolerances); the embedding norm and the
rotation's direction matter; a terse config.json takes NanoChatConfig's defaults; unsupported settings are refused
by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import NANOCHAT, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(NANOCHAT)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.embedding_norm and arch.qk_norm_after_rotary and not arch.gated_mlp and arch.logit_softcap == 3.0
    assert torch.equal(weights["embed_norm"], torch.ones(64)) and torch.equal(weights["layers.1.q_norm"], torch.ones(16))
    assert torch.equal(weights["rope.inv_freq"], -prepared.reference.model.rotary_emb.inv_freq)


def test_the_embedding_norm_and_the_rotation_direction_matter(prepared):
    recipe = prepared.recipe
    unnormed = dataclasses.replace(recipe.architecture, embedding_norm=False)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=unnormed,
                                      weights=equivalence.layout_tensors(recipe, unnormed))
    forward = [w.tensor.neg() if w.name == "rope.inv_freq" else w.tensor for w in recipe.weights]
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=2), weights=forward)


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("nanochat-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    def edit(config):
        for key in ("hidden_act", "rms_norm_eps", "final_logit_softcapping"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert (arch.mlp_activation, arch.rms_norm_eps, arch.logit_softcap) == (
        reference.hidden_act, reference.rms_norm_eps, reference.final_logit_softcapping)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "tanh"}, "hidden_act"),
    ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

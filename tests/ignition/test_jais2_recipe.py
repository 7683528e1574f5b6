"""The Jais 2 recipe against transformers' Jais2ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py JAIS2): LayerNorms with biases, q/k/v/o biases and the non-gated relu^2
MLP with biases, untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached
prefix pages) equal the reference's (test_equivalence's checks and tolerances); the layout is the reference's
weights (no weight + 1 on the norms); a terse config.json takes Jais2Config's defaults; unsupported settings are
refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import JAIS2, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(JAIS2)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_weights_are_the_references(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.layer_norm and arch.norm_bias and not arch.gated_mlp and arch.mlp_activation == "relu2"
    assert arch.mlp_bias and arch.qkv_bias and arch.o_bias and arch.rms_norm_eps == 1e-4
    layer = prepared.reference.model.layers[1]
    assert torch.equal(weights["layers.1.input_norm"], layer.input_layernorm.weight)
    assert torch.equal(weights["layers.1.up.weight"], layer.mlp.up_proj.weight)


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("jais2-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    def edit(config):
        for key in ("hidden_act", "layer_norm_eps"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert (arch.mlp_activation, arch.rms_norm_eps) == (reference.hidden_act, reference.layer_norm_eps)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "tanh"}, "hidden_act"),
    ({"layer_norm_eps": None}, "layer_norm_eps"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

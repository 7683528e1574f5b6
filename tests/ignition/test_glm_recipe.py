"""The GLM v1 recipe (the glm4 module's, without sandwich norms) against transformers' GlmForCausalLM on a tiny
random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): the fused gate_up_proj, q/k/v biases, interleaved partial rotary
(half of each head), untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from
cached prefix pages) equal the reference's (test_equivalence's checks and tolerances); the layout holds no
sandwich norms; a terse config.json takes GlmConfig's defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import GLM, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GLM)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_layout_is_llamas_with_the_fused_gate_up(prepared):
    weights, layer = dict(prepared.recipe.weights), prepared.reference.model.layers[1]
    arch = prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.sandwich_norms and arch.qkv_bias and not arch.o_bias
    assert torch.equal(weights["layers.1.gate_up.weight"], layer.mlp.gate_up_proj.weight)
    assert torch.equal(weights["layers.1.post_norm"], layer.post_attention_layernorm.weight)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GLM, seed=4), tmp_path_factory.mktemp("glm-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """rms_norm_eps and the partial rotary factor left out are GlmConfig's 1.5625e-7 and 0.5."""
    def edit(config):
        config.pop("rms_norm_eps")
        config["rope_parameters"].pop("partial_rotary_factor")

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    recipe = load_checkpoint(directory)
    assert recipe.architecture.rms_norm_eps == reference.rms_norm_eps == 1.5625e-7
    assert reference.rope_parameters["partial_rotary_factor"] == 0.5
    assert dict(recipe.weights)["rope.inv_freq"][4:].count_nonzero() == 0


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "an odd rotary width": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.2),
                            "partial_rotary_factor"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_glm_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

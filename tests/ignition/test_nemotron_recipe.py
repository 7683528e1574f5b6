"""The Nemotron recipe against transformers' NemotronForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): LayerNorm1P norms (weight + 1) with biases, the non-gated relu^2 MLP
with biases, q/k/v/o biases, partial rotary (half of each head), untied. Prefill logits, scored log-probabilities
and greedy tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); the prepared norms are the reference's weights plus one; a terse config.json takes NemotronConfig's
defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import NEMOTRON, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(NEMOTRON)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_norms_are_the_references_plus_one(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.layer_norm and arch.norm_bias and not arch.gated_mlp and arch.mlp_activation == "relu2"
    assert arch.qkv_bias and arch.o_bias and arch.mlp_bias and arch.rms_norm_eps == 1e-4
    norms = {"layers.1.input_norm": layer.input_layernorm, "layers.1.post_norm": layer.post_attention_layernorm,
             "final_norm": model.norm}
    for slot, norm in norms.items():
        assert torch.equal(weights[slot], norm.weight + 1.0), slot
        assert torch.equal(weights[slot + "_bias"], norm.bias), slot
    assert torch.equal(weights["layers.1.up.bias"], layer.mlp.up_proj.bias)
    rotated = weights["rope.inv_freq"]
    assert torch.equal(rotated[:4], model.rotary_emb.inv_freq) and not rotated[4:].any()


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(NEMOTRON, seed=4), tmp_path_factory.mktemp("nemotron-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """norm_eps, hidden_act and the partial rotary factor left out are NemotronConfig's 1e-5, relu2 and 0.5."""
    def edit(config):
        for key in ("norm_eps", "hidden_act"):
            config.pop(key)
        config["rope_parameters"].pop("partial_rotary_factor")

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert (reference.norm_eps, reference.hidden_act, reference.rope_parameters["partial_rotary_factor"]) == (
        1e-5, "relu2", 0.5)
    assert arch.rms_norm_eps == 1e-5 and arch.mlp_activation == "relu2"
    assert dict(load_checkpoint(directory).weights)["rope.inv_freq"][4:].count_nonzero() == 0


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="relu6"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "an odd rotary width": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.2),
                            "partial_rotary_factor"),
    "a null norm_eps": (lambda config: config.update(norm_eps=None), "norm_eps"),
    "no key/value heads": (lambda config: config.pop("num_key_value_heads"), "num_key_value_heads"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_nemotron_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

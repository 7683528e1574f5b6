"""The Arcee recipe against transformers' ArceeForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): the non-gated relu^2 MLP with biases, q/k/v/o biases, a YaRN rope,
tied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal
the reference's (test_equivalence's checks and tolerances); the prepared layout is the reference's weights; two
ranks hold their rows of the MLP; a terse config.json takes ArceeConfig's defaults; unsupported settings are
refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.activations import plain_activation
from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import ARCEE, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(ARCEE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_weights_are_the_references(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.gated_mlp and arch.mlp_activation == "relu2" and arch.mlp_bias and arch.tie_word_embeddings
    assert torch.equal(weights["layers.1.up.weight"], layer.mlp.up_proj.weight)
    assert torch.equal(weights["layers.1.up.bias"], layer.mlp.up_proj.bias)
    assert torch.equal(weights["layers.1.down.bias"], layer.mlp.down_proj.bias)
    assert torch.equal(weights["rope.inv_freq"], model.rotary_emb.inv_freq)


def test_relu2_and_gelu_equal_the_references_activations():
    x = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 3
    for name, ours in (("relu2", "relu2"), ("gelu", "gelu")):
        assert torch.equal(plain_activation(ours, x), transformers.activations.ACT2FN[name](x)), name


def test_two_ranks_hold_their_rows_of_the_mlp(prepared):
    width = prepared.recipe.architecture.intermediate_size // 2
    equivalence.assert_two_rank_shares(
        prepared.recipe, rows={"layers.0.up.weight": width, "layers.0.up.bias": width},
        columns={"layers.0.down.weight": width}, whole=("layers.0.down.bias",))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(ARCEE, seed=4), tmp_path_factory.mktemp("arcee-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """hidden_act, rms_norm_eps and head_dim left out (or null) are ArceeConfig's relu2, 1e-5 and hidden / heads."""
    def edit(config):
        for key in ("hidden_act", "rms_norm_eps"):
            config.pop(key)
        config["head_dim"] = None

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert (reference.hidden_act, reference.rms_norm_eps, reference.head_dim) == ("relu2", 1e-5, 16)
    assert arch.mlp_activation == "relu2" and arch.rms_norm_eps == 1e-5 and arch.head_dim == 16


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="relu6"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "a partial rotary": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_arcee_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

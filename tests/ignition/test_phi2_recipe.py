"""The Phi-2 recipe against transformers' PhiForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): LayerNorms with biases, the parallel block, the non-gated gelu_new MLP
with biases, q/k/v/dense biases, partial rotary (8 of each head's 16 dims, theta 100), an lm_head bias, untied.
Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); the prepared layout is the reference's weights and the
head bias matters; a terse config.json takes PhiConfig's defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import PHI2, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(PHI2)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_weights_are_the_references(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.layer_norm and arch.norm_bias and arch.parallel_block and not arch.gated_mlp and arch.head_bias
    assert arch.mlp_activation == "gelu_tanh" and arch.layer_windows == (0, 0)
    assert not any("post_norm" in name for name in weights)
    assert torch.equal(weights["layers.1.input_norm"], layer.input_layernorm.weight)
    assert torch.equal(weights["layers.1.input_norm_bias"], layer.input_layernorm.bias)
    assert torch.equal(weights["final_norm_bias"], model.final_layernorm.bias)
    assert torch.equal(weights["lm_head_bias"], prepared.reference.lm_head.bias)
    assert torch.equal(weights["layers.1.o.bias"], layer.self_attn.dense.bias)
    assert torch.equal(weights["layers.1.up.bias"], layer.mlp.fc1.bias)
    assert torch.equal(weights["layers.1.down.weight"], layer.mlp.fc2.weight)
    inv_freq = weights["rope.inv_freq"]
    assert torch.equal(inv_freq[:4], model.rotary_emb.inv_freq) and not inv_freq[4:].any()


def test_the_head_bias_matters(prepared):
    """Without the lm_head bias the logits differ from the reference by more than ten times the tolerance."""
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    prompt = equivalence.random_prompt(13, seed=1)
    expected = equivalence.reference_last_logits(prepared, prompt)
    logits = equivalence.prefill_logits(arch, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < 1e-4
    zeroed = [torch.zeros_like(w.tensor) if w.name == "lm_head_bias" else w.tensor for w in recipe.weights]
    logits = equivalence.prefill_logits(arch, zeroed, prompt)
    assert equivalence.relative_error(logits, expected) > 10 * equivalence.TOLERANCE


def test_two_ranks_hold_their_rows_of_the_mlp(prepared):
    arch = prepared.recipe.architecture
    width = arch.intermediate_size // 2
    equivalence.assert_two_rank_shares(
        prepared.recipe,
        rows={"layers.0.up.weight": width, "layers.0.up.bias": width, "lm_head_bias": arch.vocab_size // 2},
        columns={"layers.0.down.weight": width},
        whole=("layers.0.down.bias", "layers.0.input_norm_bias", "final_norm_bias"))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(PHI2, seed=4), tmp_path_factory.mktemp("phi2-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """layer_norm_eps, hidden_act and partial_rotary_factor left out are PhiConfig's 1e-5, gelu_new and 0.5."""
    import transformers

    def edit(config):
        for key in ("layer_norm_eps", "hidden_act"):
            config.pop(key)
        config["rope_parameters"].pop("partial_rotary_factor")

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    assert (reference.layer_norm_eps, reference.hidden_act) == (1e-5, "gelu_new")
    assert reference.rope_parameters["partial_rotary_factor"] == 0.5
    recipe = load_checkpoint(directory)
    assert recipe.architecture.rms_norm_eps == 1e-5 and recipe.architecture.mlp_activation == "gelu_tanh"
    assert dict(recipe.weights)["rope.inv_freq"][4:].count_nonzero() == 0


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic", factor=2.0), "rope_type"),
    "an odd rotary width": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.1),
                            "partial_rotary_factor"),
    "q/k layer norms": (lambda config: config.update(qk_layernorm=True), "qk_layernorm"),
    "a null layer_norm_eps": (lambda config: config.update(layer_norm_eps=None), "layer_norm_eps"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_phi2_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

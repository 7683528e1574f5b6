"""The StarCoder2 recipe against transformers' Starcoder2ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): LayerNorms with biases, the non-gated gelu_pytorch_tanh MLP with
biases, q/k/v/o biases, every layer sliding over a window of 5 (shorter than the prompts), theta 100, untied.
Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); the prepared layout is the reference's weights and the
norm biases matter; a terse config.json takes Starcoder2Config's defaults; unsupported settings are refused by
name.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import STARCODER2, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(STARCODER2)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_weights_are_the_references(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.layer_norm and arch.norm_bias and not arch.gated_mlp and arch.mlp_activation == "gelu_tanh"
    assert arch.layer_windows == (5, 5) and arch.qkv_bias and arch.o_bias and arch.mlp_bias
    norms = {"input_norm": layer.input_layernorm, "post_norm": layer.post_attention_layernorm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], norm.weight), slot
        assert torch.equal(weights[f"layers.1.{slot}_bias"], norm.bias), slot
    assert torch.equal(weights["final_norm_bias"], model.norm.bias)
    assert torch.equal(weights["layers.1.up.weight"], layer.mlp.c_fc.weight)
    assert torch.equal(weights["layers.1.up.bias"], layer.mlp.c_fc.bias)
    assert torch.equal(weights["layers.1.down.bias"], layer.mlp.c_proj.bias)


def test_the_norm_biases_matter(prepared):
    """With the norm biases zeroed the logits differ from the reference by more than ten times the tolerance."""
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    prompt = equivalence.random_prompt(13, seed=1)
    expected = equivalence.reference_last_logits(prepared, prompt)
    logits = equivalence.prefill_logits(arch, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < 1e-4
    zeroed = [torch.zeros_like(w.tensor) if w.name.endswith("norm_bias") else w.tensor for w in recipe.weights]
    logits = equivalence.prefill_logits(arch, zeroed, prompt)
    assert equivalence.relative_error(logits, expected) > 10 * equivalence.TOLERANCE


def test_two_ranks_hold_their_rows_of_the_mlp(prepared):
    arch = prepared.recipe.architecture
    width = arch.intermediate_size // 2
    equivalence.assert_two_rank_shares(
        prepared.recipe, rows={"layers.0.up.weight": width, "layers.0.up.bias": width},
        columns={"layers.0.down.weight": width},
        whole=("layers.0.down.bias", "layers.0.input_norm_bias", "final_norm_bias"))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(STARCODER2, seed=4), tmp_path_factory.mktemp("starcoder2-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """norm_epsilon, hidden_act, the window and num_key_value_heads left out are Starcoder2Config's 1e-5,
    gelu_pytorch_tanh, none (full attention) and 2 (Llama's fallback would have been one per head)."""
    import transformers

    def edit(config):
        for key in ("norm_epsilon", "hidden_act", "sliding_window", "num_key_value_heads"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    assert (reference.norm_epsilon, reference.hidden_act, reference.sliding_window) == (1e-5, "gelu_pytorch_tanh", None)
    arch = load_checkpoint(directory).architecture
    assert arch.rms_norm_eps == 1e-5 and arch.mlp_activation == "gelu_tanh" and arch.layer_windows == (0, 0)
    assert reference.num_key_value_heads == arch.num_kv_heads == 2


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic", factor=2.0), "rope_type"),
    "a partial rotary": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
    "a null norm_epsilon": (lambda config: config.update(norm_epsilon=None), "norm_epsilon"),
    "a zero window": (lambda config: config.update(sliding_window=0), "sliding_window"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_starcoder2_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

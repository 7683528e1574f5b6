"""The StableLM recipe against transformers' StableLmForCausalLM on tiny random float32 checkpoints.

The shape (tests/ignition/hf_checkpoints.py): LayerNorms with biases, the parallel residual, per-head q/k
LayerNorms, q/k/v biases, partial rotary (half of each head), untied. Prefill logits, scored log-probabilities and
greedy tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); the per-head norms are the reference's, stacked in the rotary order; the sequential block (no
parallel residual, no q/k norms, StableLM's default quarter rotary) equals the reference's prefill logits too; two
ranks hold their heads' norm rows; a terse config.json takes StableLmConfig's defaults; unsupported settings are
refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.moe import rotary_order

from . import test_equivalence as equivalence
from .hf_checkpoints import STABLELM, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(STABLELM)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_weights_are_the_references(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.layer_norm and arch.norm_bias and arch.parallel_block and arch.qk_norm_heads and arch.qkv_bias
    assert not arch.o_bias and arch.gated_mlp and "layers.1.post_norm" not in weights
    assert torch.equal(weights["layers.1.input_norm_bias"], layer.input_layernorm.bias)
    assert torch.equal(weights["final_norm_bias"], model.norm.bias)
    order = rotary_order(arch.head_dim, 8)
    for kind, norms in (("q", layer.self_attn.q_layernorm.norms), ("k", layer.self_attn.k_layernorm.norms)):
        assert torch.equal(weights[f"layers.1.{kind}_norm"], torch.cat([norm.weight[order] for norm in norms])), kind


def test_the_sequential_block_equals_the_reference(tmp_path):
    """use_parallel_residual and qk_layernorm off, the default quarter rotary: prefill logits within tolerance."""
    overrides = dict(STABLELM.overrides) | {"use_parallel_residual": False, "qk_layernorm": False,
                                            "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}
    family = dataclasses.replace(STABLELM, name="stablelm-sequential", overrides=tuple(overrides.items()))
    reference = random_model(family, seed=2)
    recipe = load_checkpoint(write_checkpoint(reference, tmp_path / "sequential"))
    arch = recipe.architecture
    assert not arch.parallel_block and not arch.qk_norm and "layers.0.post_norm_bias" in dict(recipe.weights)
    assert dict(recipe.weights)["rope.inv_freq"][2:].count_nonzero() == 0  # 4 of 16 dims rotate
    prompt = equivalence.random_prompt(13, seed=1)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    logits = equivalence.prefill_logits(arch, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < equivalence.TOLERANCE


def test_two_ranks_hold_their_heads_norm_rows(prepared):
    arch = prepared.recipe.architecture
    equivalence.assert_two_rank_shares(
        prepared.recipe, rows={"layers.0.q_norm": arch.q_size // 2, "layers.0.k_norm": arch.kv_size // 2},
        whole=("layers.0.input_norm_bias", "final_norm_bias"))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(STABLELM, seed=4), tmp_path_factory.mktemp("stablelm-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """layer_norm_eps and the partial rotary factor left out are StableLmConfig's 1e-5 and 0.25, and a head_dim
    that leaves the rotary table's width (int(head_dim * 0.25) = 4) sizes nothing (heads are hidden_size /
    num_attention_heads wide): the prefill logits are the reference's."""
    def edit(config):
        config.pop("layer_norm_eps")
        config["rope_parameters"].pop("partial_rotary_factor")
        config["head_dim"] = 19

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    assert reference.config.layer_norm_eps == 1e-5
    assert reference.config.rope_parameters["partial_rotary_factor"] == 0.25
    recipe = load_checkpoint(directory)
    arch = recipe.architecture
    assert arch.rms_norm_eps == 1e-5 and arch.head_dim == 16
    prompt = equivalence.random_prompt(13, seed=1)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    logits = equivalence.prefill_logits(arch, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < equivalence.TOLERANCE


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "an odd rotary width": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.2),
                            "partial_rotary_factor"),
    "a null layer_norm_eps": (lambda config: config.update(layer_norm_eps=None), "layer_norm_eps"),
    "a head_dim that resizes the rotary table": (lambda config: config.update(head_dim=8), "head_dim"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_stablelm_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

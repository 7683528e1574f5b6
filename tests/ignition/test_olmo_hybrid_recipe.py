"""OLMo Hybrid (OlmoHybridForCausalLM) against transformers on tiny random float32 checkpoints
(tests/ignition/hf_checkpoints.py): Gated DeltaNet layers 0 and 2 (beta doubled, or not), an OLMo 2
attention layer 1 (no pre-norms, whole-projection q/k norms, norms on the attention's and the MLP's
outputs), rotary or unrotated (rope_theta null).

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in
chunks (the state carried between them) and decoded, and for a continuous batch of different lengths;
the output-norm placement, beta's scale, the linear-attention norm's own epsilon and the NoPE tables
each matter; the layout, the layer kinds and the defaults follow the config class; unsupported settings
are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.recipes.olmo_hybrid import layer_kinds

from . import test_equivalence as equivalence
from .hf_checkpoints import OLMO_HYBRID, OLMO_HYBRID_NOPE, assert_refused
from .test_granitemoehybrid_recipe import assert_chunked_prompt_matches, prepared_once


@pytest.fixture(scope="module")
def rotary(tmp_path_factory):
    return prepared_once(OLMO_HYBRID, tmp_path_factory)


@pytest.fixture(scope="module")
def nope(tmp_path_factory):
    return prepared_once(OLMO_HYBRID_NOPE, tmp_path_factory)


@pytest.fixture(scope="module", params=[OLMO_HYBRID, OLMO_HYBRID_NOPE], ids=lambda family: family.name)
def each(request, tmp_path_factory):
    return prepared_once(request.param, tmp_path_factory)


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(each):
    assert_chunked_prompt_matches(each)


def test_a_continuous_batch_of_different_lengths_matches_transformers(rotary):
    """(The other shape's state and mixer are the same code: its chunked prompt covers it.)"""
    equivalence.test_continuous_batch_of_different_lengths_matches(rotary)


PROMPT = equivalence.random_prompt(12, seed=9)


def test_the_output_norms_matter(rotary):
    """The attention layer with pre-norms in place of its output norms (the same norm weights) is off."""
    arch = rotary.recipe.architecture
    moved = dataclasses.replace(arch, post_norm_attention=False)
    weights = dict(rotary.recipe.weights)
    renamed = {"layers.1.input_norm": "layers.1.attn_out_norm", "layers.1.post_norm": "layers.1.mlp_out_norm"}
    tensors = [weights[renamed.get(slot.name, slot.name)] for slot in weight_layout(moved)]
    equivalence.assert_change_matters(rotary, PROMPT, arch=moved, weights=tensors)


def test_beta_scale_matters(rotary):
    arch = rotary.recipe.architecture
    assert arch.recurrent.beta_scale == 2.0
    unscaled = dataclasses.replace(arch, recurrent=dataclasses.replace(arch.recurrent, beta_scale=1.0))
    equivalence.assert_change_matters(rotary, PROMPT, arch=unscaled)


def test_the_output_norm_epsilon_matters(nope):
    """The linear-attention output norm's 1e-5, not the checkpoint's rms_norm_eps (0.1 here)."""
    arch = nope.recipe.architecture
    assert arch.recurrent.norm_eps == 1e-5 and arch.rms_norm_eps == 0.1 and arch.recurrent.beta_scale == 1.0
    shared = dataclasses.replace(arch, recurrent=dataclasses.replace(arch.recurrent, norm_eps=None))
    equivalence.assert_change_matters(nope, PROMPT, arch=shared)


def test_nope_tables_matter(nope, rotary):
    """rope_theta null: zero frequencies (no rotation); the rotary family's frequencies in their place are off."""
    weights = dict(nope.recipe.weights)
    assert torch.equal(weights["rope.inv_freq"], torch.zeros(8))
    rotated = [dict(rotary.recipe.weights)["rope.inv_freq"] if w.name == "rope.inv_freq" else w.tensor
               for w in nope.recipe.weights]
    equivalence.assert_change_matters(nope, PROMPT, weights=rotated)


def test_the_prepared_layout(rotary):
    arch, weights = rotary.recipe.architecture, dict(rotary.recipe.weights)
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    assert arch.attention_layers == (1,) and arch.qk_norm_whole and arch.post_norm_attention
    assert "layers.1.input_norm" not in weights and "layers.0.attn_out_norm" not in weights
    state = rotary.reference.state_dict()
    src = "model.layers.0.linear_attn."
    parts = [state[src + f"{name}_proj.weight"] for name in ("q", "k", "v", "g", "b", "a")]
    assert torch.equal(weights["layers.0.delta.in_proj.weight"], torch.cat(parts))
    assert torch.equal(weights["layers.1.q_norm"], state["model.layers.1.self_attn.q_norm.weight"])
    assert torch.equal(weights["layers.1.mlp_out_norm"], state["model.layers.1.post_feedforward_layernorm.weight"])
    torch.testing.assert_close(weights["layers.2.delta.A"], -torch.exp(state["model.layers.2.linear_attn.A_log"]))


def test_layer_kinds_follow_the_config_class():
    for layers in (3, 4, 9):
        config = transformers.OlmoHybridConfig(num_hidden_layers=layers)
        assert list(layer_kinds({"num_hidden_layers": layers})) == config.layer_types
    with pytest.raises(UnsupportedCheckpoint, match="layer_types"):
        layer_kinds({"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2})


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.OlmoHybridConfig()
    for key, value in REFERENCE_DEFAULTS["OlmoHybridForCausalLM"].items():
        expected = reference.rope_parameters[key] if key == "rope_theta" else getattr(reference, key)
        assert value == expected, key


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c["rope_parameters"].update(rope_type="linear", factor=2.0), "rope_type"),
    (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (lambda c: c.update(layer_types=["linear_attention", "sliding_attention", "linear_attention"]), "layer_types"),
    (lambda c: c.update(layer_types=["linear_attention"] * 3), "layer_types"),
], ids=["hidden_act", "rope_type", "partial rotary", "another layer kind", "no attention layer"])
def test_unsupported_settings_are_refused_by_name(rotary, tmp_path, edit, named):
    assert_refused(rotary.directory, tmp_path, edit, named)

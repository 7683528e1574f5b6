"""The EXAONE 4 recipe against transformers' Exaone4ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): norms only after the attention and the MLP, per-head q/k RMS norms,
sliding, sliding, global layers over a window of 5 (shorter than the prompts; the global layer rotates nothing),
a llama3-scaled rope, untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from
cached prefix pages) equal the reference's (test_equivalence's checks and tolerances); the prepared layout is the
reference's weights; the unrotated global layer matters; a terse config.json takes Exaone4Config's defaults;
unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import EXAONE4, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(EXAONE4)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_weights_are_the_references(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.pre_norms and arch.sandwich_norms and arch.qk_norm and not arch.qk_norm_whole
    assert arch.layer_windows == (5, 5, 0) and arch.nope_layers == (2,)
    norms = {"attn_out_norm": layer.post_attention_layernorm, "mlp_out_norm": layer.post_feedforward_layernorm,
             "q_norm": layer.self_attn.q_norm, "k_norm": layer.self_attn.k_norm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], norm.weight), slot
    assert torch.equal(weights["rope.inv_freq"], model.rotary_emb.inv_freq)


def test_the_unrotated_global_layer_matters(prepared):
    """Rotating the global layer too moves the logits off the reference's by more than ten times the tolerance."""
    rotated = dataclasses.replace(prepared.recipe.architecture, nope_layers=())
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=rotated)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(EXAONE4, seed=4), tmp_path_factory.mktemp("exaone4-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """layer_types, the pattern, the window and rms_norm_eps left out are Exaone4Config's: a pattern of 4 (the
    fourth layer global, so all three slide and rotate) over a window of 4096, epsilon 1e-5."""
    def edit(config):
        for key in ("layer_types", "sliding_window_pattern", "sliding_window", "rms_norm_eps"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert reference.layer_types == ["sliding_attention"] * 3 and reference.sliding_window == 4096
    assert arch.layer_windows == (4096,) * 3 and arch.nope_layers == () and arch.rms_norm_eps == reference.rms_norm_eps


def test_a_null_window_rotates_and_attends_fully_everywhere(checkpoint, tmp_path):
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(
        sliding_window=None, layer_types=["full_attention"] * 3))
    arch = load_checkpoint(directory).architecture
    assert arch.layer_windows == (0, 0, 0) and arch.nope_layers == ()


def _without_layer_types(**changes):
    def edit(config):
        config.pop("layer_types")
        config.update(changes)
    return edit


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "a partial rotary": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
    "a layer kind": (lambda config: config.update(layer_types=["sliding_attention", "chunked_attention", "x"]),
                     "layer_types"),
    "sliding layers without a window": (lambda config: config.update(sliding_window=None), "sliding_window"),
    "a string pattern": (_without_layer_types(sliding_window_pattern="LLG"), "sliding_window_pattern"),
    "no pattern for a null window": (_without_layer_types(sliding_window=None), "sliding_window_pattern"),
    "a null head_dim": (lambda config: config.update(head_dim=None), "head_dim"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_exaone4_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

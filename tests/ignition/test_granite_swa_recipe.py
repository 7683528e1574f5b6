"""The Granite SWA recipe against transformers' GraniteSWAForCausalLM on a tiny random float32 checkpoint
(Granite MoE SWA: tests/ignition/test_granitemoe_swa_recipe.py).

The shape (tests/ignition/hf_checkpoints.py GRANITE_SWA): Granite's multipliers, a learned sink per head, a full
layer without positions and two sliding layers (a window of 5, shorter than the prompts) rotating with rope bases
1000 and 500. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal
the reference's (test_equivalence's checks and tolerances); the sinks, the second rope table and the unrotated
layer matter; a terse config.json takes the config class's defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.llama import rope_inv_freq

from . import test_equivalence as equivalence
from .hf_checkpoints import GRANITE_SWA, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GRANITE_SWA)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.attention_sinks and arch.layer_windows == (0, 5, 5) and arch.nope_layers == (0,)
    assert arch.local_rope_layers == (2,) and arch.embedding_scale == 4.0
    model = prepared.reference.model
    assert torch.equal(weights["layers.1.sinks"], model.layers[1].self_attn.sinks)
    assert torch.allclose(weights["rope.inv_freq"], rope_inv_freq({"rope_theta": 1000.0}, 16))
    assert torch.allclose(weights["rope.local_inv_freq"], rope_inv_freq({"rope_theta": 500.0}, 16))


def test_the_sinks_the_second_table_and_the_unrotated_layer_matter(prepared):
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    sinkless = dataclasses.replace(arch, attention_sinks=False)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=sinkless,
                                      weights=equivalence.layout_tensors(recipe, sinkless))
    one_table = dataclasses.replace(arch, local_rope_layers=())
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=2), arch=one_table,
                                      weights=equivalence.layout_tensors(recipe, one_table))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=3),
                                      arch=dataclasses.replace(arch, nope_layers=()))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("granite-swa-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """Layer kinds, bases and window left out are GraniteSWAConfig's: full at layer 0, sliding over 128, one base."""
    def edit(config):
        for key in ("layer_types", "layer_rope_theta", "sliding_window", "rms_norm_eps"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert reference.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert arch.layer_windows == (0, 128, 128) and arch.nope_layers == () and arch.local_rope_layers == ()
    assert arch.rms_norm_eps == reference.rms_norm_eps == 1e-5


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"layer_rope_theta": [100.0, 1000.0, 500.0]}, "3 distinct bases"),
    ({"layer_rope_theta": [0, 1000.0]}, "layer_rope_theta"),
    ({"layer_rope_theta": [0, -1.0, 500.0]}, "layer_rope_theta"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                          "original_max_position_embeddings": 64}}, "second base"),
    ({"sliding_window": None}, "sliding_window"),
    ({"attention_multiplier": 0}, "attention_multiplier"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

"""The Ministral 3 text recipe against transformers' Ministral3ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): a YaRN rope over an original context of 16 and Llama 4's query
scaling with beta 0.5 (the prompts and their continuations pass 16, batched ones 32 too), untied. Prefill logits,
scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); the query scaling matters; a config.json without rope settings takes
Ministral3Config's; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import transformers

from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import MINISTRAL3, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(MINISTRAL3)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_query_scaling_matters(prepared):
    """Without it the logits of a 40-token prompt (positions past 2 * 16) move by more than ten times the
    tolerance."""
    arch = prepared.recipe.architecture
    temperature = arch.query_temperature
    assert (temperature.floor_scale, temperature.scale, temperature.position_offset) == (16.0, 0.5, 0.0)
    assert temperature.layers == (0, 1) and arch.layer_windows == (0, 0)
    unscaled = dataclasses.replace(arch, query_temperature=None)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(30, seed=1), arch=unscaled)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(MINISTRAL3, seed=4), tmp_path_factory.mktemp("ministral3-checkpoint"))


def test_without_rope_settings_the_references_are_taken(checkpoint, tmp_path):
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.pop("rope_parameters"))
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert reference.rope_parameters["llama_4_scaling_beta"] == arch.query_temperature.scale == 0.1
    assert reference.rope_parameters["original_max_position_embeddings"] == arch.query_temperature.floor_scale


def _rope(**changes):
    def edit(config):
        config["rope_parameters"].update(changes)
    return edit


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (_rope(rope_type="dynamic"), "rope_type"),
    "no scaling beta": (lambda config: config["rope_parameters"].pop("llama_4_scaling_beta"), "llama_4_scaling_beta"),
    "a zero original context": (_rope(original_max_position_embeddings=0), "original_max_position_embeddings"),
    "a zero window": (lambda config: config.update(sliding_window=0), "sliding_window"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_ministral3_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

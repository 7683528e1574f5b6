"""The Ministral recipe against transformers' MinistralForCausalLM on a tiny random float32 checkpoint, and
InternLM3 (which transformers runs as Llama) through the llama recipe.

Ministral's shape (tests/ignition/hf_checkpoints.py): sliding, full, sliding layers over a window of 5 (shorter
than the prompts), untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached
prefix pages) equal the reference's (test_equivalence's checks and tolerances); without layer_types every layer
slides (MinistralConfig's rule); unsupported settings (a null window among them) are refused by name. An
InternLM3 checkpoint (declared InternLM3ForCausalLM, with q/k/v/o and MLP biases) gives the reference's prefill
logits.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import MINISTRAL, Family, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(MINISTRAL)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_layer_kinds_are_the_references(prepared):
    arch = prepared.recipe.architecture
    assert arch.layer_windows == (5, 0, 5) and not arch.qkv_bias and not arch.o_bias


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(MINISTRAL, seed=4), tmp_path_factory.mktemp("ministral-checkpoint"))


def test_without_layer_types_every_layer_slides(checkpoint, tmp_path):
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.pop("layer_types"))
    assert transformers.AutoConfig.from_pretrained(directory).layer_types == ["sliding_attention"] * 3
    assert load_checkpoint(directory).architecture.layer_windows == (5, 5, 5)


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "a layer kind": (lambda config: config.update(layer_types=["sliding_attention", "chunked_attention", "x"]),
                     "layer_types"),
    "a null window": (lambda config: config.update(sliding_window=None, layer_types=["full_attention"] * 3),
                      "sliding_window"),
    "a null head_dim": (lambda config: config.update(head_dim=None), "head_dim"),
    "a partial rotary": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_ministral_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])


def test_an_internlm3_checkpoint_gives_the_references_logits(tmp_path):
    family = Family("internlm3", transformers.InternLM3Config, (
        ("qkv_bias", True), ("bias", True), ("head_dim", 16), ("tie_word_embeddings", False),
        ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0})))
    reference = random_model(family, seed=1)
    directory = rewritten_checkpoint(write_checkpoint(reference, tmp_path / "written"), tmp_path,
                                     lambda config: config.update(architectures=["InternLM3ForCausalLM"]))
    recipe = load_checkpoint(directory)
    arch = recipe.architecture
    assert arch.qkv_bias and arch.o_bias and arch.mlp_bias and arch.layer_windows == (0, 0)
    prompt = equivalence.random_prompt(13, seed=1)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    logits = equivalence.prefill_logits(arch, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < equivalence.TOLERANCE

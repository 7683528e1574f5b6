"""The VaultGemma recipe (the gemma module's, Gemma 2 without sandwich norms) against transformers'
VaultGemmaForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): sliding, full, sliding layers over a window of 5, query_pre_attn_scalar
8, both soft caps, tied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached
prefix pages) equal the reference's (test_equivalence's checks and tolerances); the layout holds Llama's norms
(pre_feedforward_layernorm as post_norm, 1 + w) and no sandwich norms; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import weight_layout

from . import test_equivalence as equivalence
from .hf_checkpoints import VAULTGEMMA, assert_refused, random_model, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(VAULTGEMMA)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_layout_has_no_sandwich_norms(prepared):
    weights, layer = dict(prepared.recipe.weights), prepared.reference.model.layers[1]
    arch = prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.sandwich_norms and arch.attention_softcap == 5.0 and arch.logit_softcap == 3.0
    assert arch.layer_windows == (5, 0, 5) and arch.query_pre_attn_scalar == 8
    assert torch.equal(weights["layers.1.post_norm"], 1.0 + layer.pre_feedforward_layernorm.weight)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(VAULTGEMMA, seed=4), tmp_path_factory.mktemp("vaultgemma-checkpoint"))


REFUSED = {
    "another activation": (lambda config: config.update(hidden_activation="gelu"), "hidden_activation"),
    "bidirectional attention": (lambda config: config.update(use_bidirectional_attention=True),
                                "use_bidirectional_attention"),
    "a zero soft cap": (lambda config: config.update(attn_logit_softcapping=0), "attn_logit_softcapping"),
    "a layer kind": (lambda config: config.update(layer_types=["sliding_attention", "chunked_attention", "x"]),
                     "layer_types"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_vaultgemma_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

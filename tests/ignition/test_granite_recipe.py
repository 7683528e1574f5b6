"""The Granite recipe against transformers' GraniteForCausalLM on a tiny random float32 checkpoint
with every multiplier away from 1 (embedding 4, attention scale 0.2, residual 0.5, logits divided by
2.5): prefill logits, scored log-probabilities, greedy tokens, batches and prefix-cache
continuations equal the reference's (test_equivalence's checks and tolerances). The residual
multiplier is folded into the o and down projections and the logits divisor into the final norm,
tied embeddings included; multipliers the programs cannot hold are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from . import test_equivalence as equivalence
from .hf_checkpoints import GRANITE, Family, assert_refused, random_model, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GRANITE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_multipliers_in_the_prepared_model(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    model = prepared.reference.model
    assert arch.embedding_scale == 4.0 and arch.attention_scale == pytest.approx(0.2, rel=1e-15)
    assert arch.layer_windows == (0, 0) and arch.o_bias
    attention, mlp = model.layers[1].self_attn, model.layers[1].mlp
    assert torch.equal(weights["layers.1.o.weight"], attention.o_proj.weight * 0.5)
    assert torch.equal(weights["layers.1.o.bias"], attention.o_proj.bias * 0.5)
    assert torch.equal(weights["layers.1.down.weight"], mlp.down_proj.weight * 0.5)
    assert torch.equal(weights["final_norm"], model.norm.weight / 2.5)


# ---------------------------------------------------------------------------------------------------
# config.json: tied embeddings, refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GRANITE, seed=8), tmp_path_factory.mktemp("granite"))


def test_tied_embeddings_keep_the_logits_divisor_out_of_the_embeddings(tmp_path):
    """Tied, the head is the embedding matrix the input lookup shares: the divisor stays in the
    final norm, and the prepared model gives the reference's logits, scores and greedy tokens."""
    from .test_config_fuzz import Variant, check_variant

    tied = Family("granite-tied", GRANITE.config_class, (*GRANITE.overrides, ("tie_word_embeddings", True)))
    assert check_variant(Variant(tied), tmp_path) == "matches"


REFUSED = {
    "a zero embedding multiplier": (lambda c: c.update(embedding_multiplier=0.0), "embedding_multiplier"),
    "a negative attention multiplier": (lambda c: c.update(attention_multiplier=-0.1), "attention_multiplier"),
    "a tiny attention multiplier": (lambda c: c.update(attention_multiplier=1e-200), "attention_multiplier"),
    "a zero logits divisor": (lambda c: c.update(logits_scaling=0), "logits_scaling"),
    "a string residual multiplier": (lambda c: c.update(residual_multiplier="0.5"), "residual_multiplier"),
    "null head_dim": (lambda c: c.update(head_dim=None), "head_dim"),
    "dynamic rope": (lambda c: c.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope_type"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_multipliers_the_programs_cannot_hold_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

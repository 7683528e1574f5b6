"""The PhiMoE recipe against transformers' PhimoeForCausalLM on a tiny random float32 checkpoint, and
helios::moe_route_sparsemixer against transformers' sparsemixer.

The shape (tests/ignition/hf_checkpoints.py PHIMOE): LayerNorms with biases, q/k/v/o and lm_head
biases, SparseMixer top-2 routing of 4 experts with a jitter threshold of 0.3 (its masks bind on
these logits), Phi-3.5-MoE's longrope (the short factors, equal mscales 1.2), untied. Prefill logits,
scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); a served core does too; the threshold and the
mscale matter; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import helios.abi.moe_sparsemixer  # noqa: F401  (registers the op)
from helios.abi.registry import AbiArgumentError
from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import PHIMOE, assert_refused, random_model, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.mark.parametrize("jitter_eps", [0.0, 0.01, 0.3, 2.0])
def test_the_routing_op_is_the_references_sparsemixer(jitter_eps):
    logits = torch.randn(64, 6, generator=torch.Generator().manual_seed(5)) * 2
    logits[:8] = logits[:8].abs() * -1  # all-negative rows: the threshold's factor is |s|
    weights, ids = torch.ops.helios.moe_route_sparsemixer(logits, jitter_eps)
    from transformers.models.phimoe.modeling_phimoe import sparsemixer  # at first use: a light collection

    expected_weights, expected_ids = sparsemixer(logits, jitter_eps=jitter_eps, training=False)
    assert torch.equal(ids, expected_ids) and torch.equal(weights, expected_weights)


def test_the_routing_op_refuses_a_bad_threshold():
    with pytest.raises(AbiArgumentError, match="jitter_eps"):
        torch.ops.helios.moe_route_sparsemixer(torch.zeros(2, 4), -0.1)


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(PHIMOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(4, 2, 32, (0, 1), scoring="sparsemixer", normalize=False, jitter_eps=0.3)
    assert arch.layer_norm and arch.norm_bias and arch.head_bias and arch.qkv_bias and arch.o_bias
    assert arch.rotary_factor == 1.2
    assert torch.equal(weights["lm_head_bias"], prepared.reference.lm_head.bias)


@pytest.mark.parametrize("switch", ["jitter_eps", "mscale"])
def test_the_threshold_and_the_mscale_matter(prepared, switch):
    arch = prepared.recipe.architecture
    changed = (dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, jitter_eps=0.0)) if switch == "jitter_eps"
               else dataclasses.replace(arch, rotary_factor=1.0))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=14), arch=changed)


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, PHIMOE)


def test_tied_embeddings_keep_the_lm_head_bias(tmp_path):
    """Tied: the bias follows final_norm_bias (the head's slot), and the logits are the reference's."""
    family = dataclasses.replace(PHIMOE, name="phimoe-tied",
                                 overrides=PHIMOE.overrides + (("tie_word_embeddings", True),))
    reference = random_model(family, seed=6)
    recipe = load_checkpoint(write_checkpoint(reference, tmp_path))
    names = [weight.name for weight in recipe.weights]
    assert names[names.index("final_norm_bias") + 1] == "lm_head_bias" and "lm_head" not in names
    prompt = equivalence.random_prompt(13, seed=15)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    ours = equivalence.prefill_logits(recipe.architecture, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(ours, expected) < equivalence.TOLERANCE


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(PHIMOE, seed=4), tmp_path_factory.mktemp("phimoe-checkpoint"))


def _rope(**changes):
    rope = {"rope_type": "longrope", "rope_theta": 100.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "short_mscale": 1.2, "long_mscale": 1.2, "original_max_position_embeddings": 64}
    return dict(rope_parameters={**rope, **changes})


REFUSED = {
    "another expert count": (dict(num_experts_per_tok=3), "num_experts_per_tok"),
    "a negative threshold": (dict(router_jitter_noise=-1.0), "router_jitter_noise"),
    "unequal mscales": (_rope(long_mscale=1.5), "long_mscale"),
    "a short factor list of another length": (_rope(short_factor=[1.0] * 4), "short_factor"),
    "a zero sliding window": (dict(sliding_window=0), "sliding_window"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_phimoe_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)

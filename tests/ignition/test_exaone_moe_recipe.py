"""The K-EXAONE recipe against transformers' ExaoneMoeForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py EXAONE_MOE): per-head q/k RMS norms, sliding, sliding, global layers over
a window of 5 (shorter than the prompts; the global layer rotates nothing), a dense then two sparse layers of 8
experts routed as DeepSeek-V3 routes (sigmoid scores with a random correction bias, 2 groups of which 1 is kept,
top-3 renormalised and scaled by 2) beside a shared expert; untied. Prefill logits, scored log-probabilities and
greedy tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); the unrotated global layer and the routing groups matter; a terse config.json takes ExaoneMoeConfig's
defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import EXAONE_MOE, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(EXAONE_MOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.pre_norms and not arch.sandwich_norms and arch.qk_norm and not arch.qk_norm_whole
    assert arch.layer_windows == (5, 5, 0) and arch.nope_layers == (2,) and arch.intermediate_size == 96
    assert (arch.moe.sparse_layers, arch.moe.scoring, arch.moe.num_groups, arch.moe.topk_groups, arch.moe.normalize,
            arch.moe.scale, arch.moe.shared_intermediate_size) == ((1, 2), "sigmoid", 2, 1, True, 2.0, 32)
    gate = prepared.reference.model.layers[2].mlp.gate
    assert torch.equal(weights["layers.2.router.correction_bias"], gate.e_score_correction_bias)
    assert weights["layers.2.router.correction_bias"].abs().sum() > 0


def test_the_unrotated_global_layer_matters(prepared):
    rotated = dataclasses.replace(prepared.recipe.architecture, nope_layers=())
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=rotated)


def test_the_routing_groups_matter(prepared):
    arch = prepared.recipe.architecture
    ungrouped = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, num_groups=1, topk_groups=1))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=2), arch=ungrouped)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("exaone-moe-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """Layer kinds, the window, the MLP kinds and the routing left out are ExaoneMoeConfig's: a pattern of 4 over a
    window of 4096 (all three layers slide and rotate), the first layer dense, one group, scale 2.5."""
    def edit(config):
        for key in ("layer_types", "sliding_window_pattern", "sliding_window", "mlp_layer_types", "n_group",
                    "topk_group", "routed_scaling_factor", "rms_norm_eps"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert reference.layer_types == ["sliding_attention"] * 3 and reference.mlp_layer_types == ["dense", "sparse", "sparse"]
    assert arch.layer_windows == (4096,) * 3 and arch.nope_layers == () and arch.moe.sparse_layers == (1, 2)
    assert (arch.moe.num_groups, arch.moe.scale, arch.rms_norm_eps) == (
        reference.n_group, reference.routed_scaling_factor, reference.rms_norm_eps)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ({"mlp_layer_types": ["dense"] * 3}, "without sparse layers"),
    ({"mlp_layer_types": None, "first_k_dense_replace": None}, "first_k_dense_replace"),
    ({"head_dim": None}, "head_dim"),
    ({"layer_types": None, "sliding_window": None}, "sliding_window_pattern"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

"""The DBRX recipe against transformers' DbrxForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py DBRX): LayerNorms without biases, the fused q/k/v
projection clamped to [-0.1, 0.1] (most of its outputs reach past it), 4 experts in every layer (top-2
of the softmax, renormalised), untied. Prefill logits, scored log-probabilities and greedy tokens
(single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); a served core does too (with HELIOS_FAMILY_SERVED_SWEEP=1); the clamp matters; the experts are laid out from the stored
[E F, H] matrices; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint
from support.sweeps import swept

from . import test_equivalence as equivalence
from .hf_checkpoints import DBRX, assert_refused, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(DBRX)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout_stacks_the_stored_experts(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(4, 2, 32, (0, 1), normalize=True)
    assert arch.layer_norm and not arch.norm_bias and arch.qkv_clip == 0.1 and arch.rms_norm_eps == 1e-5
    mlp = prepared.reference.transformer.blocks[1].ffn.experts.mlp
    assert torch.equal(weights["layers.1.experts.gate_up"][2],
                       torch.cat((mlp.w1.view(4, 32, 64)[2], mlp.v1.view(4, 32, 64)[2])))
    assert torch.equal(weights["layers.1.experts.down"][3], mlp.w2.view(4, 32, 64)[3].T)


def test_the_clamp_matters(prepared):
    unclamped = dataclasses.replace(prepared.recipe.architecture, qkv_clip=0.0)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=13), arch=unclamped)


# HELIOS_FAMILY_SERVED_SWEEP: DBRX's programs call no op with arguments other than those of test_cohere_served's
# core (LayerNorms without biases) and test_hunyuan_moe_recipe's (top-2 of the softmax, renormalised, and the
# SiLU experts); the clamp is the graph's own op, which the captured checks above run against transformers.
if swept("HELIOS_FAMILY_SERVED_SWEEP"):
    def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
        check_served_core(tmp_path, DBRX)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(DBRX, seed=4), tmp_path_factory.mktemp("dbrx-checkpoint"))


def _nested(key: str, value):
    def edit(config):
        section, name = key.split(".")
        config[section][name] = value
    return edit


def test_unnormalised_weights_are_read(checkpoint, tmp_path):
    edit = _nested("ffn_config.moe_normalize_expert_weights", None)
    assert not load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).architecture.moe.normalize


REFUSED = {
    "another activation": (_nested("ffn_config.ffn_act_fn", {"name": "gelu"}), "ffn_act_fn"),
    "another normalisation power": (_nested("ffn_config.moe_normalize_expert_weights", 2.0),
                                    "moe_normalize_expert_weights"),
    "a nested theta the reference ignores": (_nested("attn_config.rope_theta", 500000.0), "attn_config.rope_theta"),
    "a negative clamp": (_nested("attn_config.clip_qkv", -1.0), "clip_qkv"),
    "no clamp (the reference fails)": (_nested("attn_config.clip_qkv", None), "clip_qkv"),
    "tied embeddings": (lambda config: config.update(tie_word_embeddings=True), "tie_word_embeddings"),
    "too many experts per token": (_nested("ffn_config.moe_top_k", 5), "5 experts per token of 4"),
    "another rope type": (lambda config: config.update(rope_parameters={"rope_type": "longrope", "rope_theta": 100.0}),
                          "rope_type"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_dbrx_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case], error=CheckpointError)

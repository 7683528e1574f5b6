"""The Falcon-H1 recipe (FalconH1ForCausalLM) against transformers on tiny random float32
checkpoints (tests/ignition/hf_checkpoints.py): every layer runs rotary attention and a Mamba2 mixer
side by side, every muP multiplier away from 1; the mixer gated without a norm (biases, two B/C
groups, untied) or with the gated norm (one group, tied).

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in
chunks (crossing the reference's Mamba2 chunk of 8 tokens) and decoded with the carried state, and
for a continuous batch of different lengths; the layout holds both blocks per layer with the
multipliers folded; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS

from . import test_equivalence as equivalence
from .hf_checkpoints import FALCON_H1, FALCON_H1_FAMILIES, assert_refused, random_model, write_checkpoint
from .test_granitemoehybrid_recipe import assert_chunked_prompt_matches, prepare_hybrid


@pytest.fixture(scope="module", params=FALCON_H1_FAMILIES, ids=lambda family: family.name)
def prepared(request, tmp_path_factory):
    return prepare_hybrid(request.param, tmp_path_factory.mktemp(request.param.name))


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(prepared):
    assert_chunked_prompt_matches(prepared)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


def test_each_layer_holds_attention_and_mixer_with_the_multipliers_folded(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    state = prepared.reference.state_dict()
    names = [name for name in weights]
    assert names == [slot.name for slot in weight_layout(arch)]
    assert names.index("layers.1.o.weight") < names.index("layers.1.mixer.in_proj.weight")
    assert arch.parallel_mixer and arch.attention_layers == arch.recurrent.layers == (0, 1)
    assert arch.recurrent.intermediate == 96 and arch.embedding_scale == 2.0
    attention, mixer = "model.layers.1.self_attn.", "model.layers.1.mamba."
    q, k, v = weights["layers.1.qkv.weight"].split([64, 32, 32])
    torch.testing.assert_close(k, state[attention + "k_proj.weight"] * 1.3 * 0.7)
    torch.testing.assert_close(v, state[attention + "v_proj.weight"] * 1.3)
    torch.testing.assert_close(weights["layers.1.o.weight"], state[attention + "o_proj.weight"] * 0.8)
    in_proj = weights["layers.1.mixer.in_proj.weight"]  # rows z 96 | x 96 | B 16 | C 16 | dt 4
    torch.testing.assert_close(in_proj[:96], state[mixer + "in_proj.weight"][:96] * 0.5 * 1.2)
    torch.testing.assert_close(in_proj[-4:], state[mixer + "in_proj.weight"][-4:] * 0.7 * 1.2)
    torch.testing.assert_close(weights["layers.1.mixer.out.weight"], state[mixer + "out_proj.weight"] * 0.9)
    gate = weights["layers.1.gate_up.weight"][:96]
    torch.testing.assert_close(gate, state["model.layers.1.feed_forward.gate_proj.weight"] * 1.1)
    torch.testing.assert_close(weights["final_norm"], state["model.final_layernorm.weight"] * 0.5)
    assert ("layers.0.mixer.norm" in weights) is arch.recurrent.gated_norm
    if prepared.family is FALCON_H1:
        torch.testing.assert_close(weights["layers.1.mixer.in_proj.bias"][96:192],
                                   state[mixer + "in_proj.bias"][96:192] * 1.5)
        torch.testing.assert_close(weights["layers.1.qkv.bias"][64:96], state[attention + "k_proj.bias"] * 0.7)
        assert torch.equal(weights["layers.1.qkv.bias"][:64], state[attention + "q_proj.bias"])


def test_parallel_mixer_needs_a_mixer_in_every_layer(prepared):
    arch = prepared.recipe.architecture
    with pytest.raises(CheckpointError, match="parallel_mixer"):
        dataclasses.replace(arch, recurrent=dataclasses.replace(arch.recurrent, layers=(0,)))


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.FalconH1Config()
    for key, value in REFERENCE_DEFAULTS["FalconH1ForCausalLM"].items():
        assert value == getattr(reference, key), key


REFUSED = {
    "the norm before the gate": (dict(mamba_rms_norm=True, mamba_norm_before_gate=True), "mamba_norm_before_gate"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                             "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "a rope type": (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}), "rope_type"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "mixer heads": (dict(mamba_d_head=20), "mamba heads"),
    "a short multiplier list": (dict(ssm_multipliers=[1.0, 1.0]), "ssm_multipliers"),
    "a multiplier string": (dict(key_multiplier="0.7"), "key_multiplier"),
    "a zero embedding multiplier": (dict(embedding_multiplier=0.0), "embedding_multiplier"),
    "null head_dim": (dict(head_dim=None), "head_dim"),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(FALCON_H1), tmp_path_factory.mktemp("falcon-h1-checkpoint"))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)

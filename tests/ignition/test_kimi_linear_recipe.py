"""Kimi Linear (KimiLinearForCausalLM) against transformers on a tiny random float32 checkpoint
(tests/ignition/hf_checkpoints.py): Kimi Delta Attention layers 0 and 2 (a decay per key channel),
latent attention without positions in layer 1, experts with grouped sigmoid routing and a shared expert.

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in chunks
(the state carried between them) and decoded, and for a continuous batch of different lengths; the
per-channel decay matters (one decay per head is off); the layout, layer kinds and defaults follow the
config class; unsupported settings and tensor parallelism are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.recipes.kimi_linear import layer_kinds
from helios.ignition.sharding import rank_architecture

from . import test_equivalence as equivalence
from .hf_checkpoints import KIMI_LINEAR, assert_refused
from .test_granitemoehybrid_recipe import assert_chunked_prompt_matches, prepare_hybrid


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_hybrid(KIMI_LINEAR, tmp_path_factory.mktemp("kimi_linear"))


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(prepared):
    assert_chunked_prompt_matches(prepared)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


def test_the_per_channel_decay_matters(prepared):
    """dt_bias averaged over each head's channels (and f_b's rows likewise): one decay per head, off."""
    weights = []
    for w in prepared.recipe.weights:
        tensor = w.tensor
        if w.name.endswith(("kda.dt_bias", "kda.f_b.weight")):
            heads = tensor.reshape(3, 8, *tensor.shape[1:])
            tensor = heads.mean(1, keepdim=True).expand_as(heads).reshape(tensor.shape).contiguous()
        weights.append(tensor)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(12, seed=4), weights=weights)


def test_the_prepared_layout(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    assert arch.recurrent.layers == (0, 2) and arch.attention_layers == (1,) and arch.latent.norm_eps == 1e-6
    assert arch.recurrent.state_shape == (3, 8, 8) and arch.moe.sparse_layers == (1, 2)
    assert torch.equal(weights["rope.inv_freq"], torch.zeros(8))  # the latent layers rotate nothing
    state = prepared.reference.state_dict()
    src = "model.layers.2.self_attn."
    parts = [state[src + f"{name}_proj.weight"] for name in "qkvb"]
    assert torch.equal(weights["layers.2.kda.in_proj.weight"], torch.cat(parts))
    torch.testing.assert_close(weights["layers.2.kda.A"], -torch.exp(state[src + "forget_gate.A_log"].reshape(3)))
    assert weights["layers.2.kda.dt_bias"].dtype == torch.float32


def test_layer_kinds_follow_the_config_class():
    for layers in (5, 9):
        config = transformers.KimiLinearConfig(num_hidden_layers=layers)
        assert list(layer_kinds({"num_hidden_layers": layers})) == config.layer_types
    linear = {"full_attn_layers": [2], "kda_layers": [1, 3]}
    config = transformers.KimiLinearConfig(num_hidden_layers=3, linear_attn_config=linear)
    assert list(layer_kinds({"num_hidden_layers": 3, "linear_attn_config": linear})) == config.layer_types
    with pytest.raises(UnsupportedCheckpoint, match="layer_types"):
        layer_kinds({"num_hidden_layers": 3})  # only layer 0... every layer linear: no attention layer


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.KimiLinearConfig()
    for key, value in REFERENCE_DEFAULTS["KimiLinearForCausalLM"].items():
        assert value == getattr(reference, key), key


def test_tensor_parallelism_is_refused_by_name(prepared):
    with pytest.raises(CheckpointError, match="Kimi Delta Attention"):
        rank_architecture(prepared.recipe.architecture, 2)


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(attention_bias=True), "attention_bias"),
    (lambda c: c.update(num_key_value_heads=2), "num_key_value_heads"),
    (lambda c: c.update(layer_types=["linear_attention", "sliding_attention", "linear_attention"]), "layer_types"),
], ids=["hidden_act", "attention_bias", "key heads", "another layer kind"])
def test_unsupported_settings_are_refused_by_name(prepared, tmp_path, edit, named):
    assert_refused(prepared.directory, tmp_path, edit, named)


def test_a_geometry_without_heads_is_refused():
    from helios.ignition.recurrent_geometry import KimiDeltaGeometry

    assert KimiDeltaGeometry((0,), 0, 8, 4).problems(2) and dataclasses.replace(
        KimiDeltaGeometry((0,), 2, 8, 4), conv_kernel=1).problems(2)

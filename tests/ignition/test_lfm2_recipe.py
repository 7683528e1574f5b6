"""LFM2 (Lfm2ForCausalLM) and LFM2-MoE (Lfm2MoeForCausalLM) against transformers on tiny random float32
checkpoints (tests/ignition/hf_checkpoints.py): gated short convolutions in layers 0 and 2 (their windows in
state rows), attention with per-head q/k norms in layer 1; LFM2-MoE's experts in layers 1 and 2 (sigmoid
routing with a choice bias, renormalised and scaled).

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in
chunks (the convolution window carried between them) and decoded with the carried state, and for a
continuous batch of different lengths; the gates' order and LFM2-MoE's choice bias matter; the layout, the MLP width and the
layer kinds follow the config class; two ranks cut the channels; unsupported settings are refused by
name. (The served core's snapshots and offload: tests/runtime/test_hybrid_state_families.py, with
HELIOS_HYBRID_SERVED_ALL=1.)
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.recipes.lfm2 import layer_kinds, mlp_width
from helios.ignition.recurrent_geometry import ShortConvGeometry
from helios.ignition.sharding import rank_architecture

from . import test_equivalence as equivalence
from .hf_checkpoints import LFM2, LFM2_MOE, assert_refused
from .test_granitemoehybrid_recipe import assert_chunked_prompt_matches, prepared_once


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_once(LFM2, tmp_path_factory)


@pytest.fixture(scope="module", params=[LFM2, LFM2_MOE], ids=lambda family: family.name)
def each(request, tmp_path_factory):
    return prepared_once(request.param, tmp_path_factory)


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(each):
    assert_chunked_prompt_matches(each)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    """(The other shape's state and mixer are the same code: its chunked prompt covers it.)"""
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


def test_the_experts_layout_and_the_choice_bias_matters(tmp_path_factory):
    """LFM2-MoE: layer 0 dense, layers 1 and 2 sparse (per-expert w1 / w3 stacked as gate_up); routing
    without its choice bias (``use_expert_bias`` off) gives other logits."""
    import dataclasses

    moe = prepared_once(LFM2_MOE, tmp_path_factory)
    arch, weights = moe.recipe.architecture, dict(moe.recipe.weights)
    assert arch.moe.sparse_layers == (1, 2) and arch.moe.scoring == "sigmoid" and arch.moe.scale == 1.5
    assert arch.moe.correction_bias and arch.moe.normalize and arch.intermediate_size == 96
    assert arch.tie_word_embeddings and not arch.recurrent.bias and "lm_head" not in weights
    state = moe.reference.state_dict()
    experts = "model.layers.2.feed_forward.experts."  # the checkpoint's per-expert w1 / w3 / w2, stacked
    assert torch.equal(weights["layers.2.experts.gate_up"], state[experts + "gate_up_proj"])
    assert torch.equal(weights["layers.2.experts.down"], state[experts + "down_proj"])
    assert torch.equal(weights["layers.2.router.correction_bias"], state["model.layers.2.feed_forward.expert_bias"])
    assert torch.equal(weights["layers.0.short.conv.bias"], torch.zeros(64))  # no conv_bias: a zero bias
    unbiased = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, correction_bias=False))
    equivalence.assert_change_matters(moe, equivalence.random_prompt(16, seed=2), arch=unbiased,
                                      weights=equivalence.layout_tensors(moe.recipe, unbiased))


def test_the_gates_order_matters(prepared):
    """in_proj's rows are the input gate B, the output gate C, then x: B and C swapped change the logits."""
    swapped = []
    for w in prepared.recipe.weights:
        tensor = w.tensor
        if w.name.endswith("short.in_proj.weight") or w.name.endswith("short.in_proj.bias"):
            b, c, x = tensor.chunk(3)
            tensor = torch.cat([c, b, x])
        swapped.append(tensor)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(11, seed=5), weights=swapped)


def test_the_prepared_layout(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert arch.recurrent == ShortConvGeometry(layers=(0, 2), channels=64, conv_kernel=3, bias=True)
    assert arch.attention_layers == (1,) and arch.qk_norm and arch.intermediate_size == 96
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    state = prepared.reference.state_dict()
    conv = "model.layers.2.conv."
    assert torch.equal(weights["layers.2.short.in_proj.weight"], state[conv + "in_proj.weight"])
    assert torch.equal(weights["layers.2.short.conv.weight"], state[conv + "conv.weight"].reshape(64, 3))
    assert torch.equal(weights["layers.2.short.out.bias"], state[conv + "out_proj.bias"])
    assert torch.equal(weights["layers.1.q_norm"], state["model.layers.1.self_attn.q_layernorm.weight"])
    assert torch.equal(weights["final_norm"], state["model.embedding_norm.weight"])
    assert arch.recurrent.state_shape == (1, 1, 1)  # the window is the whole state


def test_two_ranks_cut_the_channels(prepared):
    shard = rank_architecture(prepared.recipe.architecture, 2)
    assert shard.recurrent.channels == 32 and shard.recurrent.conv_dim == 32
    rows = {"layers.0.short.conv.weight": 32, "layers.0.short.conv.bias": 32}
    equivalence.assert_two_rank_shares(prepared.recipe, rows=rows, columns={"layers.0.short.out.weight": 32},
                                       whole=("layers.0.short.out.bias",))
    from helios.ignition.sharding import rank_weights

    full = dict(prepared.recipe.weights)["layers.0.short.in_proj.weight"]
    cut = dict(rank_weights(prepared.recipe, 2, 1))["layers.0.short.in_proj.weight"]
    assert torch.equal(cut, torch.cat([part[32:] for part in full.chunk(3)]))
    with pytest.raises(CheckpointError, match="short convolution channels"):
        rank_architecture(prepared.recipe.architecture, 3)


def test_mlp_width_and_layer_kinds_follow_the_config_class():
    for settings in (dict(), dict(block_auto_adjust_ff_dim=False), dict(block_ffn_dim_multiplier=1),
                     dict(block_ffn_dim_multiplier=1.3, block_multiple_of=24)):
        config = transformers.Lfm2Config(hidden_size=48, intermediate_size=200, **settings)
        mlp = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(config)
        assert mlp_width(config.to_dict()) == mlp.w1.out_features, settings
    for attention in (None, [1, 3]):
        config = transformers.Lfm2Config(num_hidden_layers=4, full_attn_idxs=attention)
        terse = {"num_hidden_layers": 4, "full_attn_idxs": attention}
        if "conv" in config.layer_types:
            assert list(layer_kinds(terse)) == config.layer_types
    with pytest.raises(UnsupportedCheckpoint, match="layer_types"):
        layer_kinds({"num_hidden_layers": 4})  # every layer attends: no short convolution


@pytest.mark.parametrize("source", ["Lfm2ForCausalLM", "Lfm2MoeForCausalLM"])
def test_config_defaults_are_the_config_class_defaults(source):
    reference = getattr(transformers, source.replace("ForCausalLM", "Config"))()
    for key, value in REFERENCE_DEFAULTS[source].items():
        expected = reference.rope_parameters[key] if key == "rope_theta" else getattr(reference, key)
        assert value == expected, key


@pytest.mark.parametrize("edit, named", [
    (lambda c: c["rope_parameters"].update(rope_type="linear", factor=2.0), "rope_type"),
    (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (lambda c: c.update(layer_types=["conv", "sliding_attention", "conv"]), "layer_types"),
    (lambda c: c.update(layer_types=["full_attention"] * 3), "layer_types"),
], ids=["rope_type", "partial rotary", "another layer kind", "no short convolution"])
def test_unsupported_settings_are_refused_by_name(prepared, tmp_path, edit, named):
    assert_refused(prepared.directory, tmp_path, edit, named)


def test_a_negative_dense_layer_count_is_refused_by_name():
    from helios.ignition.recipes.lfm2 import mixture

    with pytest.raises(UnsupportedCheckpoint, match="num_dense_layers"):
        mixture("Lfm2MoeForCausalLM", {"num_dense_layers": -1}, 3)
    assert mixture("Lfm2MoeForCausalLM", {"num_dense_layers": 3}, 3) is None  # every layer dense

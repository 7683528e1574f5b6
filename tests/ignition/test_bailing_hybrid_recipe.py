"""The Bailing hybrid (BailingHybridForCausalLM) against transformers on a tiny random float32 checkpoint
(tests/ignition/hf_checkpoints.py): Kimi Delta Attention layers 0 and 2 with full-rank gates and the safe
gate, rotary latent attention with gated heads in layer 1, experts with grouped sigmoid routing and a shared
expert.

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in chunks and
decoded, and for a continuous batch of different lengths; the safe gate, the head gate and the rotary rows'
de-interleaving each matter; the layout, layer kinds and defaults follow the config class; unsupported
settings and tensor parallelism are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint
from helios.ignition.recipes.bailing_hybrid import layer_kinds
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.sharding import rank_architecture

from . import test_equivalence as equivalence
from .hf_checkpoints import BAILING_HYBRID, assert_refused
from .test_granitemoehybrid_recipe import assert_chunked_prompt_matches, prepare_hybrid

PROMPT = equivalence.random_prompt(12, seed=6)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_hybrid(BAILING_HYBRID, tmp_path_factory.mktemp("bailing_hybrid"))


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(prepared):
    assert_chunked_prompt_matches(prepared)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


def test_the_safe_gate_matters(prepared):
    arch = prepared.recipe.architecture
    assert arch.recurrent.lower_bound == -5.0 and not arch.recurrent.low_rank_gates
    softplus = dataclasses.replace(arch, recurrent=dataclasses.replace(arch.recurrent, lower_bound=0.0))
    equivalence.assert_change_matters(prepared, PROMPT, arch=softplus)


def test_the_head_gate_matters(prepared):
    arch = prepared.recipe.architecture
    ungated = dataclasses.replace(arch, latent=dataclasses.replace(arch.latent, head_gate=False))
    equivalence.assert_change_matters(prepared, PROMPT, arch=ungated,
                                      weights=equivalence.layout_tensors(prepared.recipe, ungated))


def test_the_rotary_rows_are_de_interleaved(prepared):
    """The checkpoint's q and kv_a rows as they are (interleaved rotary pairs) give other logits."""
    state = prepared.reference.state_dict()
    attn = "model.layers.1.self_attn."
    raw = {"layers.1.q.weight": state[attn + "q_proj.weight"], "layers.1.kv_a.weight": state[attn + "kv_a_proj_with_mqa.weight"]}
    weights = [raw.get(w.name, w.tensor) for w in prepared.recipe.weights]
    equivalence.assert_change_matters(prepared, PROMPT, weights=weights)


def test_the_prepared_layout(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    assert arch.recurrent.layers == (0, 2) and arch.attention_layers == (1,) and arch.latent.head_gate
    state = prepared.reference.state_dict()
    src = "model.layers.0.self_attn."
    assert torch.equal(weights["layers.0.kda.f.weight"], state[src + "forget_gate.f_proj.weight"])
    assert torch.equal(weights["layers.1.head_gate.weight"], state["model.layers.1.self_attn.g_proj.weight"])
    torch.testing.assert_close(weights["layers.0.kda.A"], -torch.exp(state[src + "forget_gate.A_log"]))


def test_layer_kinds_follow_the_config_class():
    for layers in (6, 13):
        config = transformers.BailingHybridConfig(num_hidden_layers=layers)
        assert list(layer_kinds({"num_hidden_layers": layers})) == config.layer_types
    with pytest.raises(UnsupportedCheckpoint, match="layer_types"):
        layer_kinds({"num_hidden_layers": 3})  # every layer linear (layer_group_size 6): no attention layer


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.BailingHybridConfig()
    for key, value in REFERENCE_DEFAULTS["BailingHybridForCausalLM"].items():
        assert value == getattr(reference, key), key


def test_tensor_parallelism_is_refused_by_name(prepared):
    with pytest.raises(CheckpointError, match="Kimi Delta Attention"):
        rank_architecture(prepared.recipe.architecture, 2)


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(attention_bias=True), "attention_bias"),
    (lambda c: c["rope_parameters"].update(rope_type="linear", factor=2.0), "rope_type"),
    (lambda c: c.update(expert_swiglu_limit_list=[0, 7.0, 7.0]), "expert_swiglu_limit_list"),
    (lambda c: c.update(linear_head_dim=8), "linear_head_dim"),
], ids=["hidden_act", "attention_bias", "rope_type", "swiglu limits", "linear_head_dim"])
def test_unsupported_settings_are_refused_by_name(prepared, tmp_path, edit, named):
    assert_refused(prepared.directory, tmp_path, edit, named)


def test_the_head_gate_needs_a_hybrid_decoder(prepared):
    """The plain decoder's latent attention does not read the gate: an Architecture asking it to is refused."""
    with pytest.raises(CheckpointError, match="head_gate"):
        dataclasses.replace(prepared.recipe.architecture, recurrent=None)

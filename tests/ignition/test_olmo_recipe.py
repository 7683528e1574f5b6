"""The OLMo 2 and OLMo 3 recipe against transformers' Olmo2ForCausalLM / Olmo3ForCausalLM on tiny
random float32 checkpoints.

Two shapes (tests/ignition/hf_checkpoints.py): OLMo 2 with q/k/v/o biases; OLMo 3 with sliding,
full, sliding layers over a window of 5 (shorter than the prompts) and a default local rope beside
a linear-scaled global one. Both norm only after the attention and the MLP and norm q and k over the
whole projections. Prefill logits, scored log-probabilities and greedy tokens (single, batched,
from cached prefix pages) equal the reference's (test_equivalence's checks and tolerances); the
prepared layout has no pre-norm slots and whole-width q/k norms; two ranks hold their heads'
entries of those norms; OLMo 3's legacy config.json gets the reference's rope tables (its sliding
layers keep theta 500000); unsupported settings are refused by name.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from helios.ignition.architecture import Architecture, CheckpointError, weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import (OLMO2, OLMO3, OLMO_FAMILIES, assert_refused, random_model, rewritten_checkpoint,
                             write_checkpoint)


@pytest.fixture(scope="module", params=OLMO_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_layout_has_no_pre_norms_and_whole_projection_qk_norms(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.pre_norms and arch.sandwich_norms and arch.qk_norm_whole
    assert not any(name.endswith(("input_norm", "post_norm")) for name in weights)
    norms = {"attn_out_norm": layer.post_attention_layernorm, "mlp_out_norm": layer.post_feedforward_layernorm,
             "q_norm": layer.self_attn.q_norm, "k_norm": layer.self_attn.k_norm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], norm.weight), slot
    assert weights["layers.1.q_norm"].shape == (arch.q_size,) and weights["layers.1.k_norm"].shape == (arch.kv_size,)
    assert arch.qkv_bias == arch.o_bias == (prepared.family is OLMO2)
    if prepared.family is OLMO3:
        rotary, config = model.rotary_emb, prepared.reference.config
        assert torch.equal(weights["rope.inv_freq"], rotary.full_attention_inv_freq)
        assert torch.equal(weights["rope.local_inv_freq"], rotary.sliding_attention_inv_freq)
        assert arch.local_rope_layers == (0, 2) and arch.layer_windows == (config.sliding_window, 0,
                                                                            config.sliding_window)


def test_two_ranks_hold_their_heads_entries_of_the_qk_norms(prepared):
    arch = prepared.recipe.architecture
    equivalence.assert_two_rank_shares(
        prepared.recipe, rows={"layers.0.q_norm": arch.q_size // 2, "layers.0.k_norm": arch.kv_size // 2},
        whole=("layers.0.attn_out_norm",))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(OLMO3, seed=4), tmp_path_factory.mktemp("olmo3-checkpoint"))


def test_a_legacy_config_gets_the_references_rope_tables(checkpoint, tmp_path):
    """A transformers 4 config.json (top-level rope_theta and rope_scaling): Olmo3Config gives the
    top-level theta and scaling to the full layers only, the sliding layers keep 500000; without
    layer_types every layer but each fourth slides."""
    def edit(config):
        config.pop("rope_parameters")
        config.update(rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 2.0})

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    rotary = transformers.AutoModelForCausalLM.from_pretrained(directory).model.rotary_emb
    weights = dict(load_checkpoint(directory).weights)
    assert torch.equal(weights["rope.inv_freq"], rotary.full_attention_inv_freq)
    assert torch.equal(weights["rope.local_inv_freq"], rotary.sliding_attention_inv_freq)
    assert rotary.sliding_attention_inv_freq[1].item() == pytest.approx(500000.0 ** (-2 / 16))
    path = directory / "config.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "layer_types"}))
    arch = load_checkpoint(directory).architecture
    assert arch.local_rope_layers == (0, 1, 2) and arch.layer_windows == (5, 5, 5)


def test_olmo2_ignores_a_window_and_refuses_partial_rotary(tmp_path):
    directory = write_checkpoint(random_model(OLMO2, seed=4), tmp_path / "olmo2")
    path = directory / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "sliding_window": 4, "layer_types": ["sliding_attention"] * 2}))
    assert load_checkpoint(directory).architecture.layer_windows == (0, 0)
    config["rope_parameters"]["partial_rotary_factor"] = 0.5
    path.write_text(json.dumps(config))
    with pytest.raises(UnsupportedCheckpoint, match="partial_rotary_factor"):
        load_checkpoint(directory)


def _rope(kind, **changes):
    def edit(config):
        config["rope_parameters"][kind].update(changes)
    return edit


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "no window": (lambda config: config.update(sliding_window=None), "sliding_window"),
    "a layer kind": (lambda config: config.update(layer_types=["sliding_attention", "chunked_attention", "x"]),
                     "layer_types"),
    "too few layer kinds": (lambda config: config.update(layer_types=["full_attention"]), "layer_types"),
    "flat rope parameters": (lambda config: config.update(rope_parameters={"rope_type": "default"}),
                             "rope_parameters"),
    "sliding yarn": (_rope("sliding_attention", rope_type="yarn", factor=2.0, original_max_position_embeddings=64),
                     "rope_type"),
    "dynamic rope": (_rope("full_attention", rope_type="dynamic", factor=2.0), "rope_type"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_olmo_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])


_GOOD = dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
             head_dim=4, rms_norm_eps=1e-6, layer_windows=(0, 0))


def test_the_olmo_switches_are_checked_naming_the_field():
    good = Architecture(**_GOOD, pre_norms=False, sandwich_norms=True, qk_norm=True, qk_norm_whole=True)
    assert [s.shape for s in weight_layout(good)[1:4]] == [(16, 8), (8,), (4,)]  # qkv, q_norm [Hq D], k_norm [Hkv D]
    with pytest.raises(CheckpointError, match="pre_norms"):
        Architecture(**_GOOD, pre_norms=False)
    for switches in (dict(), dict(qk_norm=True, qk_norm_after_rotary=True)):
        with pytest.raises(CheckpointError, match="qk_norm_whole"):
            Architecture(**_GOOD, qk_norm_whole=True, **switches)

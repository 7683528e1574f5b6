"""The AFMoE recipe against transformers' AfmoeForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py AFMOE): per-head q/k norms, sliding, sliding, full layers over a window
of 5 (shorter than the prompts; the full layer rotates nothing), the attention output gated by sigmoid(gate_proj x),
q/k/v/o biases, norms before and after the attention and the MLP, embeddings scaled by sqrt(hidden_size); a dense
then two sparse layers of 8 experts (top-3 of the sigmoid scores plus a random correction bias, renormalised and
scaled by 1.5) beside a shared expert; untied. Prefill logits, scored log-probabilities and greedy tokens (single,
batched, from cached prefix pages) equal the reference's (test_equivalence's checks and tolerances); the output gate,
the unrotated full layer and the embedding scale matter; a terse config.json takes AfmoeConfig's defaults;
unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import AFMOE, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(AFMOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.attention_gate and arch.sandwich_norms and arch.pre_norms and arch.qk_norm and arch.qkv_bias
    assert arch.layer_windows == (5, 5, 0) and arch.nope_layers == (2,) and arch.embedding_scale == 8.0
    assert (arch.moe.sparse_layers, arch.moe.scoring, arch.moe.normalize, arch.moe.scale, arch.moe.correction_bias,
            arch.moe.shared_intermediate_size) == ((1, 2), "sigmoid", True, 1.5, True, 32)
    layer = prepared.reference.model.layers[1]
    assert torch.equal(weights["layers.1.qkv.weight"][-64:], layer.self_attn.gate_proj.weight)
    assert torch.equal(weights["layers.1.qkv.bias"][-64:], torch.zeros(64))
    assert torch.equal(weights["layers.1.post_norm"], layer.pre_mlp_layernorm.weight)
    assert torch.equal(weights["layers.1.attn_out_norm"], layer.post_attention_layernorm.weight)
    assert torch.equal(weights["layers.1.router.correction_bias"], layer.mlp.expert_bias)


def test_the_output_gate_matters(prepared):
    recipe = prepared.recipe
    ungated = dataclasses.replace(recipe.architecture, attention_gate=False)
    rows = recipe.architecture.q_size + 2 * recipe.architecture.kv_size
    weights = [w.tensor[:rows] if w.name.endswith(("qkv.weight", "qkv.bias")) else w.tensor for w in recipe.weights]
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=ungated, weights=weights)


def test_the_unrotated_full_layer_and_the_embedding_scale_matter(prepared):
    arch = prepared.recipe.architecture
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=2),
                                      arch=dataclasses.replace(arch, nope_layers=()))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=3),
                                      arch=dataclasses.replace(arch, embedding_scale=1.0))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("afmoe-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """Layer kinds, the window, the scale and mup left out are AfmoeConfig's: every 4th layer full (all three
    slide over 1024), route_scale 1.0, unscaled embeddings."""
    def edit(config):
        for key in ("layer_types", "global_attn_every_n_layers", "sliding_window", "route_scale", "mup_enabled",
                    "rms_norm_eps"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    arch = load_checkpoint(directory).architecture
    assert reference.layer_types == ["sliding_attention"] * 3 and reference.sliding_window == 1024
    assert arch.layer_windows == (1024,) * 3 and arch.nope_layers == () and arch.embedding_scale == 1.0
    assert (arch.moe.scale, arch.rms_norm_eps) == (reference.route_scale, reference.rms_norm_eps)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"layer_types": None, "global_attn_every_n_layers": 0}, "global_attn_every_n_layers"),
    ({"sliding_window": None}, "sliding_window"),
    ({"num_dense_layers": 3}, "num_dense_layers 3"),
    ({"num_dense_layers": None}, "num_dense_layers"),
    ({"route_scale": None}, "route_scale"),
    ({"num_experts_per_tok": 9}, "9 experts per token of 8"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

"""dots.llm1 (Dots1ForCausalLM) against transformers on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): Qwen3's per-head q/k norms with q/k/v/o biases, a dense
then two sparse layers routed as DeepSeek-V3 routes (sigmoid scores with the correction bias, groups
scored by their best two, renormalised and scaled), a shared expert, the last layer sliding over 5
positions (shorter than the prompts). Prefill logits, scored log-probabilities and greedy tokens
(single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); a config.json without layer_types takes Dots1Config's; unsupported settings are refused
by name.
"""

from __future__ import annotations

import pytest

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint
from helios.ignition.recipes.dots1 import with_layer_types

from . import test_equivalence as equivalence
from .hf_checkpoints import DOTS1, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(DOTS1)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("dots1"))


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert arch.layer_windows == (0, 0, 5) and arch.qk_norm and arch.qkv_bias and arch.o_bias
    assert (arch.moe.sparse_layers, arch.moe.scoring, arch.moe.num_groups, arch.moe.topk_groups, arch.moe.normalize,
            arch.moe.scale, arch.moe.shared_intermediate_size) == ((1, 2), "sigmoid", 2, 1, True, 2.0, 32)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    gate = prepared.reference.model.layers[2].mlp.gate
    assert weights["layers.2.router.correction_bias"].abs().sum() > 0
    assert (weights["layers.2.router.correction_bias"] == gate.e_score_correction_bias).all()


def test_without_layer_types_the_layers_slide_from_max_window_layers():
    """Dots1Config's derivation: sliding from max_window_layers on where a sliding_window is set."""
    config = {"num_hidden_layers": 3, "sliding_window": 5, "max_window_layers": 1}
    assert with_layer_types(config)["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    unslid = with_layer_types({"num_hidden_layers": 2, "sliding_window": None, "max_window_layers": None})
    assert unslid["layer_types"] == ["full_attention"] * 2
    with pytest.raises(UnsupportedCheckpoint, match="max_window_layers"):
        with_layer_types({"num_hidden_layers": 2, "sliding_window": 5, "max_window_layers": None})


def test_a_config_without_layer_types_serves_the_derived_kinds(checkpoint, tmp_path):
    recipe = load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.pop("layer_types")))
    assert recipe.architecture.layer_windows == (0, 0, 5)


@pytest.mark.parametrize("change,message", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"n_routed_experts": None}, "n_routed_experts"),
    ({"first_k_dense_replace": None}, "first_k_dense_replace"),
    ({"n_group": 8, "topk_group": 1}, "n_group 8"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))

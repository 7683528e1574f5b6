"""The GLM-4 dense recipe against transformers' Glm4ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): sandwich norms, the fused gate_up_proj, q/k/v biases,
interleaved partial rotary (8 of each head's 16 dims, theta 100: every pair turns within the
prompts), untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched,
from cached prefix pages) equal the reference's (test_equivalence's checks and tolerances); the
prepared q/k rows are the reference's in the rotary layout and each GLM piece matters; a terse
config.json takes Glm4Config's defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.glm4 import rotary_layout

from . import test_equivalence as equivalence
from .hf_checkpoints import GLM4, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GLM4)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_weights_are_the_references_in_the_rotary_layout(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)] and arch.sandwich_norms
    norms = {"input_norm": layer.input_layernorm, "attn_out_norm": layer.post_self_attn_layernorm,
             "post_norm": layer.post_attention_layernorm, "mlp_out_norm": layer.post_mlp_layernorm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], norm.weight), slot
    assert torch.equal(weights["layers.1.gate_up.weight"], layer.mlp.gate_up_proj.weight)
    order, attn = rotary_layout(16, 8), layer.self_attn
    # dims 0, 2, 4, 6 (the rotated pairs' firsts), two pass-through dims, then 1, 3, 5, 7 and the rest
    assert order.tolist() == [0, 2, 4, 6, 8, 9, 10, 11, 1, 3, 5, 7, 12, 13, 14, 15]
    q, k, v = weights["layers.1.qkv.weight"].split([arch.q_size, arch.kv_size, arch.kv_size])
    assert torch.equal(q, attn.q_proj.weight.reshape(4, 16, -1)[:, order].reshape(q.shape))
    assert torch.equal(k, attn.k_proj.weight.reshape(2, 16, -1)[:, order].reshape(k.shape))
    assert torch.equal(v, attn.v_proj.weight)
    inv_freq = weights["rope.inv_freq"]
    assert torch.equal(inv_freq[:4], model.rotary_emb.inv_freq) and not inv_freq[4:].any()


def test_the_sandwich_norms_and_the_interleaved_layout_each_matter(prepared):
    """Without the output norms, or with the q/k rows in the checkpoint's order (the reference's pairs
    rotated as halves), the logits differ from the reference by more than ten times the tolerance."""
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    prompt = equivalence.random_prompt(13, seed=1)
    expected = equivalence.reference_last_logits(prepared, prompt)
    assert equivalence.relative_error(equivalence.prefill_logits(arch, recipe.weight_tensors, prompt), expected) < 1e-4
    far = 10 * equivalence.TOLERANCE
    plain = dataclasses.replace(arch, sandwich_norms=False)
    unnormed = equivalence.layout_tensors(recipe, plain)
    assert equivalence.relative_error(equivalence.prefill_logits(plain, unnormed, prompt), expected) > far
    unordered = equivalence.with_checkpoint_qk_order(recipe, rotary_layout(16, 8))
    assert equivalence.relative_error(equivalence.prefill_logits(arch, unordered, prompt), expected) > far


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GLM4, seed=4), tmp_path_factory.mktemp("glm4-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """rms_norm_eps and partial_rotary_factor left out are Glm4Config's 1.5625e-7 and 0.5 (Llama's
    fallbacks would have been 1e-6 and whole heads)."""
    import transformers

    def edit(config):
        config.pop("rms_norm_eps")
        config["rope_parameters"].pop("partial_rotary_factor")

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    assert (reference.rms_norm_eps, reference.rope_parameters["partial_rotary_factor"]) == (1.5625e-7, 0.5)
    arch = load_checkpoint(directory).architecture
    assert arch.rms_norm_eps == 1.5625e-7
    assert dict(load_checkpoint(directory).weights)["rope.inv_freq"][4:].count_nonzero() == 0


def test_a_window_in_config_json_is_not_read(checkpoint, tmp_path):
    """The reference masks causally whatever sliding_window and layer_types say."""
    recipe = load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(
        sliding_window=4, use_sliding_window=True, layer_types=["sliding_attention"] * 2)))
    assert recipe.architecture.layer_windows == (0, 0)


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic", factor=2.0), "rope_type"),
    "an odd rotary width": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.1),
                            "partial_rotary_factor"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_glm4_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])

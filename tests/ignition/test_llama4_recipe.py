"""The Llama 4 recipe against transformers' Llama4ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py LLAMA4): four layers alternating RoPE (chunked local attention
over chunks of 8 positions, L2 q/k norms after the interleaved-pair rotation) and NoPE layers (full attention,
the queries scaled by the temperature tuning with floor_scale 4, so the factor changes every 4 positions),
dense and sparse MLPs interleaved (4 experts, top-2 sigmoid weights on the experts' inputs, a shared expert).
Prompts of 13-14 tokens and 16-32 generated tokens cross many chunk boundaries. Prefill logits, scored
log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); a served core does too; each new switch matters; the multimodal
checkpoint prepares its text decoder; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, QueryTemperature, weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.window_split import sliding_layers, window_tokens

from . import test_equivalence as equivalence
from .hf_checkpoints import LLAMA4, _draw, assert_refused, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(LLAMA4)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout_and_switches(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(4, 2, 32, (1, 3), scoring="sigmoid", normalize=False,
                                        shared_intermediate_size=32, input_weighted=True)
    assert arch.intermediate_size == 96 and arch.nope_layers == (1, 3) and arch.layer_chunks == (8, 0, 8, 0)
    assert arch.qk_norm_after_rotary and arch.qk_unnormed_layers == (1, 3) and "layers.1.q_norm" not in weights
    assert torch.equal(weights["layers.0.q_norm"], torch.ones(16))
    assert arch.query_temperature == QueryTemperature(4.0, 0.5, (1, 3))
    # the chunked layers keep their keys in the window region, a window of their chunk (pages out of it released)
    assert arch.layer_extents == (8, 0, 8, 0) and window_tokens(arch) == 8 and sliding_layers(arch) == (0, 2)
    block = prepared.reference.model.layers[1].feed_forward
    assert torch.equal(weights["layers.1.experts.gate_up"], block.experts.gate_up_proj.transpose(1, 2))
    assert torch.equal(weights["layers.1.router.weight"], block.router.weight)


@pytest.mark.parametrize("switch", ["layer_chunks", "query_temperature", "input_weighted", "qk_norm"])
def test_each_switch_matters(prepared, switch):
    """Without chunks, the temperature, the input weighting or the q/k norms the prefill logits of a
    prompt crossing a chunk boundary leave the reference's."""
    recipe, arch = prepared.recipe, prepared.recipe.architecture
    changes = {"layer_chunks": dict(layer_chunks=()), "query_temperature": dict(query_temperature=None),
               "input_weighted": dict(moe=dataclasses.replace(arch.moe, input_weighted=False)),
               "qk_norm": dict(qk_norm=False, qk_norm_after_rotary=False, qk_unnormed_layers=())}[switch]
    changed = dataclasses.replace(arch, **changes)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(20, seed=11), arch=changed,
                                      weights=equivalence.layout_tensors(recipe, changed))


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, LLAMA4, prompt_lens=(5, 19, 11))


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(LLAMA4, seed=4), tmp_path_factory.mktemp("llama4-checkpoint"))


def test_the_derived_lists_follow_the_reference_defaults(checkpoint, tmp_path):
    """Without layer_types, moe_layers and no_rope_layers the config class's rules derive them."""
    def edit(config):
        for key in ("layer_types", "moe_layers", "no_rope_layers"):
            config.pop(key)
        config.update(no_rope_layer_interval=4, interleave_moe_layer_step=2, attn_temperature_tuning=False)

    arch = load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).architecture
    assert arch.nope_layers == (3,) and arch.layer_chunks == (8, 8, 8, 0) and arch.moe.sparse_layers == (1, 3)
    assert arch.qk_unnormed_layers == (3,) and arch.query_temperature is None


REFUSED = {
    "chunked layers without a chunk": (dict(attention_chunk_size=None), "attention_chunk_size"),
    "another layer kind": (dict(layer_types=["sliding_attention"] * 4), "layer_types"),
    "moe layers outside the model": (dict(moe_layers=[1, 7]), "moe_layers"),
    "a zero floor scale": (dict(floor_scale=0), "floor_scale"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                             "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "a multimodal checkpoint without a text_config": (dict(architectures=["Llama4ForConditionalGeneration"]),
                                                      "text_config"),
    "too many experts per token": (dict(num_experts_per_tok=5), "5 experts per token of 4"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_llama4_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)


def test_the_multimodal_checkpoint_prepares_its_text_decoder(tmp_path):
    """Llama4ForConditionalGeneration: text_config and the language_model tensors, the vision tower left
    out with a notice; the text logits are the multimodal reference's on a text prompt."""
    text = LLAMA4.config().to_dict()
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
                  patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(3)
    reference = transformers.Llama4ForConditionalGeneration(
        transformers.Llama4Config(text_config=text, vision_config=vision)).float().eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # hf_checkpoints' draws (spread-out weights, norms around 1)
        for name, parameter in reference.named_parameters():
            parameter.copy_(_draw(name, parameter, generator))
    recipe = load_checkpoint(write_checkpoint(reference, tmp_path))
    assert recipe.architecture.layer_chunks == (8, 0, 8, 0) and "vision tower" in recipe.notices[0]
    prompt = equivalence.random_prompt(20, seed=16)
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor([prompt])).logits[0, -1]
    ours = equivalence.prefill_logits(recipe.architecture, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(ours, expected) < equivalence.TOLERANCE

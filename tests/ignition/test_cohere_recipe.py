"""The Cohere recipes against transformers' CohereForCausalLM and Cohere2ForCausalLM on tiny random float32
checkpoints.

The shapes (tests/ignition/hf_checkpoints.py): Cohere with per-head q/k LayerNorms, q/k/v/o biases, logit_scale
0.25 and tied embeddings; Cohere2 with sliding, full, sliding layers over a window of 5 (the full layer rotates
nothing), logit_scale 0.5, untied; both with LayerNorms, the parallel block and interleaved rotary (theta 100).
Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); the prepared layout is the reference's weights in the
rotary order and each Cohere piece matters; a terse config.json takes the config classes' defaults; unsupported
settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import weight_layout
from helios.ignition.program_spec import Operation
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.glm4 import rotary_layout

from . import test_equivalence as equivalence
from .conftest import PAGE_TOKENS, VARIANTS
from .hf_checkpoints import (COHERE, COHERE_FAMILIES, assert_refused, random_model, rewritten_checkpoint,
                             write_checkpoint)


@pytest.fixture(scope="module", params=COHERE_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_weights_are_the_references_in_the_rotary_layout(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer, config = prepared.recipe.architecture, model.layers[1], prepared.reference.config
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.layer_norm and arch.parallel_block and not any(name.endswith("post_norm") for name in weights)
    assert torch.equal(weights["layers.1.input_norm"], layer.input_layernorm.weight)
    assert torch.equal(weights["final_norm"], model.norm.weight * config.logit_scale)
    order, attn = rotary_layout(16, 16), layer.self_attn
    assert order.tolist() == [*range(0, 16, 2), *range(1, 16, 2)]
    q, k, v = weights["layers.1.qkv.weight"].split([arch.q_size, arch.kv_size, arch.kv_size])
    assert torch.equal(q, attn.q_proj.weight.reshape(4, 16, -1)[:, order].reshape(q.shape))
    assert torch.equal(k, attn.k_proj.weight.reshape(2, 16, -1)[:, order].reshape(k.shape))
    assert torch.equal(v, attn.v_proj.weight)
    assert torch.equal(weights["rope.inv_freq"], model.rotary_emb.inv_freq)
    if prepared.family is COHERE:
        assert arch.qk_norm_heads and arch.tie_word_embeddings and arch.o_bias
        assert torch.equal(weights["layers.1.q_norm"], attn.q_norm.weight[:, order].reshape(-1))
        assert torch.equal(weights["layers.1.k_norm"], attn.k_norm.weight[:, order].reshape(-1))
    else:
        assert arch.layer_windows == (5, 0, 5) and arch.nope_layers == (1,) and not arch.qk_norm


def test_the_layer_norms_the_parallel_block_and_the_interleaved_layout_each_matter(prepare):
    """With RMS norms, with the MLP reading the attention's sum (a sequential block reusing input_norm),
    or with the q/k rows in the checkpoint's order, the logits differ from the reference by more
    than ten times the tolerance."""
    prepared = prepare(COHERE)
    arch, recipe = prepared.recipe.architecture, prepared.recipe
    prompt = equivalence.random_prompt(13, seed=1)
    expected = equivalence.reference_last_logits(prepared, prompt)
    assert equivalence.relative_error(equivalence.prefill_logits(arch, recipe.weight_tensors, prompt), expected) < 1e-4
    far = 10 * equivalence.TOLERANCE
    rms = dataclasses.replace(arch, layer_norm=False, qk_norm=False, qk_norm_heads=False)
    rms_weights = equivalence.layout_tensors(recipe, rms)
    assert equivalence.relative_error(equivalence.prefill_logits(rms, rms_weights, prompt), expected) > far
    sequential = dataclasses.replace(arch, parallel_block=False)
    named = dict(recipe.weights)
    reordered = []
    for slot in weight_layout(sequential):  # post_norm: the layer's input norm again
        source = slot.name.replace("post_norm", "input_norm")
        reordered.append(named[source])
    assert equivalence.relative_error(equivalence.prefill_logits(sequential, reordered, prompt), expected) > far
    unordered = equivalence.with_checkpoint_qk_order(recipe, rotary_layout(16, 16))
    assert equivalence.relative_error(equivalence.prefill_logits(arch, unordered, prompt), expected) > far


def test_two_ranks_hold_their_heads_rows_of_the_qk_norms(prepare):
    recipe = prepare(COHERE).recipe
    arch = recipe.architecture
    equivalence.assert_two_rank_shares(
        recipe, rows={"layers.0.q_norm": arch.q_size // 2, "layers.0.k_norm": arch.kv_size // 2},
        whole=("layers.0.input_norm",))


def _all_reduces(arch) -> int:
    from helios.ignition.capture import export_program

    _, exported = export_program(arch, Operation.DECODE, dict(VARIANTS)[Operation.DECODE], PAGE_TOKENS)
    reduce = torch.ops.helios.all_reduce.default
    return sum(node.op == "call_function" and node.target == reduce for node in exported.graph.nodes)


def test_a_parallel_block_on_two_ranks_sums_attention_and_mlp_with_one_all_reduce(prepare):
    """A rank's DECODE graph reduces the embeddings once and each parallel layer once (its attention
    and MLP partials added on the rank first); the same layers run sequentially reduce twice."""
    from helios.ignition.sharding import rank_architecture

    arch = rank_architecture(prepare(COHERE).recipe.architecture, 2)
    assert _all_reduces(arch) == 1 + arch.num_layers
    assert _all_reduces(dataclasses.replace(arch, parallel_block=False)) == 1 + 2 * arch.num_layers


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {family.name: write_checkpoint(random_model(family, seed=4), tmp_path_factory.mktemp(family.name))
            for family in COHERE_FAMILIES}


def test_a_terse_config_takes_the_references_defaults(checkpoints, tmp_path):
    """logit_scale, layer_norm_eps, the rope theta and the tying left out are CohereConfig's 0.0625,
    1e-5, 500000 and tied; Cohere2's layer kinds and window left out are every fourth layer full over
    4096, and its head_dim hidden_size // num_attention_heads."""
    import transformers

    def edit(config):
        for key in ("logit_scale", "layer_norm_eps", "rope_parameters", "tie_word_embeddings"):
            config.pop(key, None)

    directory = rewritten_checkpoint(checkpoints["cohere"], tmp_path / "cohere", edit)
    reference = transformers.AutoConfig.from_pretrained(directory)
    assert (reference.logit_scale, reference.layer_norm_eps, reference.tie_word_embeddings) == (0.0625, 1e-5, True)
    recipe = load_checkpoint(directory)
    weights, model = dict(recipe.weights), random_model(COHERE, seed=4).model
    assert recipe.architecture.rms_norm_eps == 1e-5 and recipe.architecture.tie_word_embeddings
    assert torch.equal(weights["final_norm"], model.norm.weight * 0.0625)
    assert torch.allclose(weights["rope.inv_freq"], 1 / 500_000.0 ** (torch.arange(0, 16, 2) / 16))

    def edit2(config):
        for key in ("layer_types", "sliding_window", "head_dim"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoints["cohere2"], tmp_path / "cohere2", edit2)
    arch = load_checkpoint(directory).architecture
    assert arch.layer_windows == (4096, 4096, 4096) and arch.nope_layers == () and arch.head_dim == 16
    directory = rewritten_checkpoint(checkpoints["cohere2"], tmp_path / "pattern", lambda config: (
        config.pop("layer_types"), config.update(sliding_window_pattern=2)))
    assert load_checkpoint(directory).architecture.nope_layers == (1,)


REFUSED = {
    "another activation": ("cohere", lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "dynamic rope": ("cohere", lambda config: config["rope_parameters"].update(rope_type="dynamic", factor=2.0),
                     "rope_type"),
    "a partial rotary": ("cohere", lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
    "a null logit_scale": ("cohere", lambda config: config.update(logit_scale=None), "logit_scale"),
    "a null head_dim": ("cohere2", lambda config: config.update(head_dim=None), "head_dim"),
    "a null layer_norm_eps": ("cohere2", lambda config: config.update(layer_norm_eps=None), "layer_norm_eps"),
    "a null window": ("cohere2", lambda config: config.update(sliding_window=None), "sliding_window"),
    "malformed layer kinds": ("cohere2", lambda config: config.update(layer_types=["sliding_attention"]),
                              "layer_types"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_cohere_settings_are_refused_by_name(checkpoints, tmp_path, case):
    family, edit, setting = REFUSED[case]
    assert_refused(checkpoints[family], tmp_path, edit, setting)

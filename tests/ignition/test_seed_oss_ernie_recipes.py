"""Seed-OSS (the llama recipe) and Ernie 4.5 dense (`ernie4_5`) against transformers on tiny random
float32 checkpoints: prefill logits, scored log-probabilities, greedy tokens, batches and
prefix-cache continuations equal the reference's (test_equivalence's checks and tolerances).

Seed-OSS: q/k/v bias without an o bias (``attention_out_bias``), a head_dim other than hidden /
heads. Ernie 4.5: biases on every projection (``use_bias``) and interleaved rotary pairs, which the
recipe de-interleaves within each q/k head. Both mask causally whatever ``sliding_window`` says,
read a terse config.json with their reference's defaults and refuse what they do not implement.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import (ERNIE4_5, LLAMA_SHAPED_FAMILIES, SEED_OSS, assert_refused, random_model,
                             rewritten_checkpoint, write_checkpoint)


@pytest.fixture(scope="module", params=LLAMA_SHAPED_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_layout(prepared):
    """Seed-OSS: q, k, v rows as they are, their bias, no o bias. Ernie 4.5: each q/k head's even
    rows, then its odd rows (values untouched), biases alike."""
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    attention = prepared.reference.model.layers[1].self_attn
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    qkv, bias = weights["layers.1.qkv.weight"], weights["layers.1.qkv.bias"]
    assert arch.layer_windows == (0, 0) and arch.head_dim == 16 and arch.qkv_bias
    if prepared.family is SEED_OSS:
        assert not arch.o_bias and not arch.mlp_bias
        assert torch.equal(qkv, torch.cat([q.weight, k.weight, v.weight]))
        assert torch.equal(bias, torch.cat([q.bias, k.bias, v.bias]))
        return
    assert arch.o_bias and arch.mlp_bias
    order = torch.cat((torch.arange(0, 16, 2), torch.arange(1, 16, 2)))
    for head, start in ((0, 0), (arch.num_heads, arch.q_size), (arch.num_heads + 1, arch.q_size + 16)):
        source = (q if head < arch.num_heads else k)
        rows = slice(16 * (head % arch.num_heads), 16 * (head % arch.num_heads + 1))
        assert torch.equal(qkv[start:start + 16], source.weight[rows][order])
        assert torch.equal(bias[start:start + 16], source.bias[rows][order])
    assert torch.equal(qkv[arch.q_size + arch.kv_size:], v.weight)


# ---------------------------------------------------------------------------------------------------
# config.json: windows, defaults and refusals.


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> its checkpoint directory, written on first use."""
    written = {}

    def get(family):
        if family.name not in written:
            written[family.name] = write_checkpoint(random_model(family, seed=6), tmp_path_factory.mktemp(family.name))
        return written[family.name]

    return get


@pytest.fixture(params=LLAMA_SHAPED_FAMILIES, ids=lambda family: family.name)
def checkpoint(request, checkpoints):
    return request.param, checkpoints(request.param)


def test_a_window_in_config_json_is_ignored_as_the_reference_ignores_it(checkpoint, tmp_path):
    family, directory = checkpoint
    def windowed(config):
        config.update(sliding_window=4, use_sliding_window=True, layer_types=["sliding_attention"] * 2)

    assert load_checkpoint(rewritten_checkpoint(directory, tmp_path, windowed)).architecture.layer_windows == (0, 0)


def test_a_terse_ernie_config_is_read_with_the_references_defaults(checkpoints, tmp_path):
    """No rope theta (500000), key/value head count (2) or tie switch (tied): Ernie4_5Config's."""
    def terse(config):
        for key in ("num_key_value_heads", "tie_word_embeddings"):
            config.pop(key)
        config["rope_parameters"] = {"rope_type": "default"}

    directory = rewritten_checkpoint(checkpoints(ERNIE4_5), tmp_path, terse)
    recipe = load_checkpoint(directory)
    config = transformers.AutoConfig.from_pretrained(directory)
    reference = transformers.models.ernie4_5.modeling_ernie4_5.Ernie4_5RotaryEmbedding(config)
    assert torch.equal(dict(recipe.weights)["rope.inv_freq"], reference.inv_freq)
    assert (recipe.architecture.num_kv_heads, recipe.architecture.tie_word_embeddings) == (2, True)
    assert config.rope_parameters["rope_theta"] == 500000.0 and config.tie_word_embeddings


REFUSED = {
    "dynamic rope": (lambda c: c.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope_type"),
    "partial rotary": (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "gelu": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_settings_the_recipes_do_not_implement_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint[1], tmp_path, *REFUSED[case])

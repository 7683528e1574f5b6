"""The Gemma 3 text recipe against transformers' Gemma3ForCausalLM on tiny random float32 checkpoints.

Two shapes (tests/ignition/hf_checkpoints.py): tied, sliding/full/sliding layers by ``layer_types``
with a window shorter than the prompts, a linear-scaled global rope beside a distinct local one and
``query_pre_attn_scalar`` other than head_dim; and untied with q/k/v/o biases, a final logit soft cap
and the legacy ``sliding_window_pattern``. Prefill logits, scored log-probabilities and greedy tokens
(single, batched, from cached prefix pages) equal the reference's (test_equivalence's checks and
tolerances); the prepared weights are the reference's folded ``1 + w`` norms and rotary tables; the
legacy config.json spelling prepares the same model; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helios.ignition.architecture import Architecture, CheckpointError, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import (GEMMA3, GEMMA3_CAPPED, GEMMA3_FAMILIES, Family, assert_refused, random_model,
                             rewritten_checkpoint, write_checkpoint)


@pytest.fixture(scope="module", params=GEMMA3_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_weights_are_the_references_folded_norms_and_rope_tables(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    norms = {"input_norm": layer.input_layernorm, "attn_out_norm": layer.post_attention_layernorm,
             "post_norm": layer.pre_feedforward_layernorm, "mlp_out_norm": layer.post_feedforward_layernorm,
             "q_norm": layer.self_attn.q_norm, "k_norm": layer.self_attn.k_norm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], 1.0 + norm.weight), slot
    assert torch.equal(weights["final_norm"], 1.0 + model.norm.weight)
    rotary = model.rotary_emb
    assert torch.equal(weights["rope.inv_freq"], rotary.full_attention_inv_freq)
    assert torch.equal(weights["rope.local_inv_freq"], rotary.sliding_attention_inv_freq)
    assert not torch.equal(rotary.full_attention_inv_freq, rotary.sliding_attention_inv_freq)
    assert arch.embedding_scale == model.embed_tokens.embed_scale.item() == 8.0
    config = prepared.reference.config
    assert arch.attention_scale == config.query_pre_attn_scalar ** -0.5 != config.head_dim ** -0.5
    sliding = tuple(i for i, kind in enumerate(config.layer_types) if kind == "sliding_attention")
    assert arch.local_rope_layers == sliding and 0 < len(sliding) < arch.num_layers
    assert all((window == config.sliding_window) == (i in sliding) for i, window in enumerate(arch.layer_windows))
    assert arch.tie_word_embeddings == (prepared.family is GEMMA3)
    assert arch.logit_softcap == (config.final_logit_softcapping or 0.0)


def test_two_ranks_hold_the_sandwich_norms_and_both_rope_tables_whole(prepared):
    from helios.ignition.sharding import rank_weights

    whole = dict(prepared.recipe.weights)
    replicated = [name for name in whole if name.endswith(("norm", "inv_freq"))]
    assert {"layers.1.attn_out_norm", "layers.1.mlp_out_norm", "rope.local_inv_freq"} <= set(replicated)
    for rank in range(2):
        cut = dict(rank_weights(prepared.recipe, 2, rank))
        assert all(torch.equal(cut[name], whole[name]) for name in replicated)


def test_every_gemma_switch_changes_the_logits(prepared):
    """Each switch matters on these checkpoints (none is vacuous): the program without it differs
    from the reference by more than ten times the tolerance."""
    arch = prepared.recipe.architecture
    prompt = equivalence.random_prompt(13, seed=1)
    expected = equivalence.reference_last_logits(prepared, prompt)
    switches = {"embedding_scale": 1.0, "query_pre_attn_scalar": 0.0, "local_rope_layers": (),
                "mlp_activation": "silu", "logit_softcap": 0.0}
    for field, value in switches.items():
        if getattr(arch, field) == value:  # (the tied shape has no logit cap)
            continue
        changed = dataclasses.replace(arch, **{field: value})
        weights = equivalence.layout_tensors(prepared.recipe, changed)  # (without local tables: no rope.local_inv_freq)
        logits = equivalence.prefill_logits(changed, weights, prompt)
        assert equivalence.relative_error(logits, expected) > 10 * equivalence.TOLERANCE, field


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GEMMA3_CAPPED, seed=4), tmp_path_factory.mktemp("gemma3-checkpoint"))


def _legacy(config):
    """A Hub config.json of Gemma 3 (transformers 4): top-level rope_theta, rope_local_base_freq and
    rope_scaling, a sliding_window_pattern without layer_types."""
    rope = config.pop("rope_parameters")
    config.pop("layer_types")
    config.update(rope_theta=rope["full_attention"]["rope_theta"], rope_scaling=None,
                  rope_local_base_freq=rope["sliding_attention"]["rope_theta"], sliding_window_pattern=2)


def test_the_legacy_layout_prepares_the_same_model(checkpoint, tmp_path):
    current = load_checkpoint(checkpoint)
    legacy = load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, _legacy))
    assert legacy.architecture == current.architecture
    assert all(a.name == b.name and torch.equal(a.tensor, b.tensor) for a, b in zip(legacy.weights, current.weights))


def test_a_legacy_linear_rope_scaling_scales_the_global_table_only(checkpoint, tmp_path):
    def edit(config):
        _legacy(config)
        config["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}

    current = dict(load_checkpoint(checkpoint).weights)
    scaled = dict(load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).weights)
    assert torch.equal(scaled["rope.inv_freq"], current["rope.inv_freq"] / 8.0)
    assert torch.equal(scaled["rope.local_inv_freq"], current["rope.local_inv_freq"])


def test_every_layer_full_prepares_one_rope_table(checkpoint, tmp_path):
    """sliding_window_pattern 1 (no sliding layer): no local layers, so no rope.local_inv_freq slot
    (preparation failed on the slot before the fuzz found it)."""
    def edit(config):
        _legacy(config)
        config["sliding_window_pattern"] = 1

    recipe = load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit))
    assert recipe.architecture.layer_windows == (0, 0) and not recipe.architecture.local_rope_layers
    assert "rope.local_inv_freq" not in dict(recipe.weights)


def test_a_terse_config_takes_the_references_defaults(tmp_path):
    """A config.json that leaves out the settings at Gemma3TextConfig's defaults (8 heads, 4 key/value
    heads, query_pre_attn_scalar 256, ...) prepares the model the reference loads (a missing head
    count was refused before the fuzz found it)."""
    import transformers

    family = Family("gemma3-terse", transformers.Gemma3TextConfig, (
        ("num_attention_heads", 8), ("num_key_value_heads", 4), ("head_dim", 8), ("query_pre_attn_scalar", 256)))
    directory = write_checkpoint(random_model(family), tmp_path / "checkpoint")
    expected = load_checkpoint(directory).architecture
    path = directory / "config.json"
    terse = json.loads(path.read_text())
    for key in ("num_attention_heads", "num_key_value_heads", "query_pre_attn_scalar", "hidden_activation",
                "sliding_window"):
        terse.pop(key)
    path.write_text(json.dumps(terse))
    config = transformers.AutoConfig.from_pretrained(directory)
    assert (config.num_attention_heads, config.num_key_value_heads, config.query_pre_attn_scalar) == (8, 4, 256)
    assert load_checkpoint(directory).architecture == expected


def _full_rope(**changes):
    def edit(config):
        config["rope_parameters"]["full_attention"].update(changes)
    return edit


REFUSED = {
    "attention soft cap": (lambda config: config.update(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    "another activation": (lambda config: config.update(hidden_activation="gelu"), "hidden_activation"),
    "a layer kind": (lambda config: config.update(layer_types=["sliding_attention", "chunked_attention"]),
                     "layer_types"),
    "too few layer kinds": (lambda config: config.update(layer_types=["full_attention"]), "layer_types"),
    "a zero pattern": (lambda config: config.update(layer_types=None, sliding_window_pattern=0),
                       "sliding_window_pattern"),
    "no window": (lambda config: config.update(sliding_window=None), "sliding_window"),
    "bidirectional": (lambda config: config.update(use_bidirectional_attention=True), "use_bidirectional_attention"),
    "a zero query scalar": (lambda config: config.update(query_pre_attn_scalar=0), "query_pre_attn_scalar"),
    "a negative logit cap": (lambda config: config.update(final_logit_softcapping=-1.0), "final_logit_softcapping"),
    "yarn": (_full_rope(rope_type="yarn", factor=2.0), "rope_type"),
    "a null local theta": (lambda config: config["rope_parameters"]["sliding_attention"].update(rope_theta=None),
                           "rope_local_base_freq"),
    "flat rope parameters": (lambda config: config.update(rope_parameters={"rope_type": "default"}),
                             "rope_parameters"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_gemma3_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])


_GOOD = dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
             head_dim=4, rms_norm_eps=1e-6, layer_windows=(3, 0))
BAD_ARCHITECTURES = {
    "mlp_activation": dict(mlp_activation="relu"),
    "embedding_scale": dict(embedding_scale=float("nan")),
    "query_pre_attn_scalar": dict(query_pre_attn_scalar=-1.0),
    "logit_softcap": dict(logit_softcap=float("inf")),
    "local_rope_layers": dict(local_rope_layers=(2,)),
}


@pytest.mark.parametrize("field", sorted(BAD_ARCHITECTURES))
def test_bad_gemma_switches_are_refused_naming_the_field(field):
    Architecture(**_GOOD, sandwich_norms=True, local_rope_layers=(0,), logit_softcap=30.0)  # the good ones
    with pytest.raises(CheckpointError, match=field):
        Architecture(**{**_GOOD, **BAD_ARCHITECTURES[field]})


def test_the_embedding_scale_is_rounded_to_the_model_dtype():
    """Gemma3TextScaledWordEmbedding multiplies by sqrt(hidden_size) cast to the weights' dtype:
    sqrt(3072) = 55.4256 is 55.5 in bfloat16 (and the reference's own buffer agrees)."""
    from helios.ignition.recipes.gemma3 import embedding_scale
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    assert embedding_scale(3072, "bfloat16") == 55.5 and embedding_scale(3072, "float32") == pytest.approx(55.4256)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        module = Gemma3TextScaledWordEmbedding(4, 3072, 0, embed_scale=3072**0.5).to(dtype)
        assert embedding_scale(3072, str(dtype).removeprefix("torch.")) == module.embed_scale.to(dtype).item()


def test_the_multimodal_decoder_refuses_gemma_layers():
    """The Qwen-VL decoder has no sandwich norms or local rope tables: it refuses them, not drops them."""
    from helios.ignition.multimodal import multimodal_decoder_hidden

    for switch in (dict(sandwich_norms=True), dict(local_rope_layers=(0,))):
        with pytest.raises(CheckpointError, match="multimodal decoder"):
            multimodal_decoder_hidden(Architecture(**_GOOD, **switch), {}, None, None, None, None)

"""The Gemma and Gemma 2 recipe against transformers' GemmaForCausalLM / Gemma2ForCausalLM on tiny random
float32 checkpoints.

Two shapes (tests/ignition/hf_checkpoints.py): Gemma 1 with head_dim 32 against hidden 64 / 4 heads,
q/k/v/o biases and the legacy "gelu" activation name, tied; Gemma 2 with sandwich norms, sliding,
full, sliding layers (Gemma2Config's default layer_types) over a window shorter than the prompts,
``query_pre_attn_scalar`` other than head_dim, an attention logit soft cap that bends most scores and
a final logit soft cap, untied. Prefill logits, scored log-probabilities and greedy tokens (single,
batched, from cached prefix pages) equal the reference's (test_equivalence's checks and tolerances);
the prepared weights are the reference's folded ``1 + w`` norms; each Gemma switch matters; the
attention soft cap reaches the programs as ``helios::paged_attention_softcap``; unsupported settings
are refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import SUPPORTED_ARCHITECTURES, load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import GEMMA2, GEMMA_FAMILIES, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module", params=GEMMA_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_both_architectures_are_supported():
    assert {"GemmaForCausalLM", "Gemma2ForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)


def test_the_prepared_weights_are_the_references_folded_norms(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    norms = {"input_norm": layer.input_layernorm}
    if prepared.family is GEMMA2:
        norms |= {"attn_out_norm": layer.post_attention_layernorm, "post_norm": layer.pre_feedforward_layernorm,
                  "mlp_out_norm": layer.post_feedforward_layernorm}
    else:
        norms |= {"post_norm": layer.post_attention_layernorm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], 1.0 + norm.weight), slot
    assert torch.equal(weights["final_norm"], 1.0 + model.norm.weight)
    assert torch.equal(weights["rope.inv_freq"], model.rotary_emb.inv_freq)
    config = prepared.reference.config
    assert arch.head_dim == config.head_dim != config.hidden_size // config.num_attention_heads or \
        prepared.family is GEMMA2
    assert arch.embedding_scale == 8.0 and arch.mlp_activation == "gelu_tanh"
    if prepared.family is GEMMA2:
        assert arch.sandwich_norms and arch.attention_scale == config.query_pre_attn_scalar ** -0.5
        assert arch.layer_windows == (5, 0, 5)
        assert (arch.attention_softcap, arch.logit_softcap) == (2.0, 12.0)
    else:
        assert not arch.sandwich_norms and arch.attention_scale == config.head_dim ** -0.5
        assert arch.layer_windows == (0, 0) and arch.attention_softcap == arch.logit_softcap == 0.0


def test_every_gemma_switch_changes_the_logits(prepared):
    """Each switch matters on these checkpoints (none is vacuous): the program without it differs
    from the reference by more than ten times the tolerance."""
    arch = prepared.recipe.architecture
    prompt = equivalence.random_prompt(13, seed=1)
    expected = equivalence.reference_last_logits(prepared, prompt)
    switches = {"embedding_scale": 1.0, "query_pre_attn_scalar": 0.0, "mlp_activation": "silu",
                "logit_softcap": 0.0, "attention_softcap": 0.0, "layer_windows": (0,) * arch.num_layers}
    changed_any = 0
    for field, value in switches.items():
        if getattr(arch, field) == value:  # (Gemma 1 has no caps, windows or query scalar)
            continue
        changed = dataclasses.replace(arch, **{field: value})
        logits = equivalence.prefill_logits(changed, equivalence.layout_tensors(prepared.recipe, changed), prompt)
        assert equivalence.relative_error(logits, expected) > 10 * equivalence.TOLERANCE, field
        changed_any += 1
    assert changed_any == (6 if prepared.family is GEMMA2 else 2)


def test_the_attention_cap_is_the_capped_op_in_every_program(prepared):
    """Gemma 2's programs call helios::paged_attention_softcap(_tuned) with the cap at every layer and
    no uncapped attention; Gemma 1's call the plain ops (their programs are every other family's)."""
    arch = prepared.recipe.architecture
    for op, (_, module) in prepared.programs.items():
        calls = [node for node in module.graph.nodes if node.op == "call_function"
                 and str(node.target).startswith("helios.paged_attention")]
        assert len(calls) == arch.num_layers, op
        capped = [node for node in calls if "softcap" in str(node.target)]
        if prepared.family is GEMMA2:
            assert len(capped) == len(calls) and all(node.args[8] == 2.0 for node in calls), op
        else:
            assert not capped, op


# ---------------------------------------------------------------------------------------------------
# config.json spellings, defaults and refusals.


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {family.name: write_checkpoint(random_model(family, seed=4), tmp_path_factory.mktemp(family.name))
            for family in GEMMA_FAMILIES}


def test_gemma2_without_layer_types_slides_every_other_layer(checkpoints, tmp_path):
    """An older config.json (no layer_types): Gemma2Config's default, even layers slide."""
    current = load_checkpoint(checkpoints["gemma2"])
    legacy = load_checkpoint(rewritten_checkpoint(checkpoints["gemma2"], tmp_path, lambda c: c.pop("layer_types")))
    assert legacy.architecture == current.architecture and current.architecture.layer_windows == (5, 0, 5)


def test_null_caps_are_no_caps(checkpoints, tmp_path):
    def edit(config):
        config.update(attn_logit_softcapping=None, final_logit_softcapping=None)

    arch = load_checkpoint(rewritten_checkpoint(checkpoints["gemma2"], tmp_path, edit)).architecture
    assert arch.attention_softcap == arch.logit_softcap == 0.0


def test_a_terse_gemma2_config_takes_the_references_caps(checkpoints, tmp_path):
    """Keys left out are Gemma2Config's defaults: the caps 50 and 30, the window 4096."""
    def edit(config):
        for key in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "hidden_activation"):
            config.pop(key)

    directory = rewritten_checkpoint(checkpoints["gemma2"], tmp_path, edit)
    arch = load_checkpoint(directory).architecture
    assert (arch.attention_softcap, arch.logit_softcap, arch.layer_windows) == (50.0, 30.0, (4096, 0, 4096))
    import transformers

    config = transformers.AutoConfig.from_pretrained(directory)
    assert (config.attn_logit_softcapping, config.final_logit_softcapping, config.sliding_window) == (50.0, 30.0, 4096)


@pytest.mark.parametrize("name", ["gemma", "gemma2"])
def test_a_yarn_rope_scales_the_rotary_tables_as_the_reference(checkpoints, tmp_path, name):
    """YaRN's attention factor multiplies the reference's cos/sin (the fuzz found it missing: every
    yarn draw's logits differed)."""
    import transformers

    rope = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 64}
    directory = rewritten_checkpoint(checkpoints[name], tmp_path, _set(rope_parameters=rope))
    arch = load_checkpoint(directory).architecture
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory)
    assert arch.rotary_factor == pytest.approx(reference.model.rotary_emb.attention_scaling, rel=1e-12) != 1.0


def _set(**changes):
    return lambda config: config.update(changes)


REFUSED = {
    ("gemma", "another activation"): (_set(hidden_act="silu"), "hidden_act"),
    ("gemma", "another hidden_activation"): (_set(hidden_activation="relu"), "hidden_activation"),
    ("gemma", "bidirectional"): (_set(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("gemma", "yarn"): (_set(rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0}), "rope"),
    ("gemma2", "another activation"): (_set(hidden_activation="gelu"), "hidden_activation"),
    ("gemma2", "a negative attention cap"): (_set(attn_logit_softcapping=-2.0), "attn_logit_softcapping"),
    ("gemma2", "a zero attention cap"): (_set(attn_logit_softcapping=0), "attn_logit_softcapping"),
    ("gemma2", "a string attention cap"): (_set(attn_logit_softcapping="50"), "attn_logit_softcapping"),
    ("gemma2", "a zero logit cap"): (_set(final_logit_softcapping=0.0), "final_logit_softcapping"),
    ("gemma2", "a null query scalar"): (_set(query_pre_attn_scalar=None), "query_pre_attn_scalar"),
    ("gemma2", "a layer kind"): (_set(layer_types=["sliding_attention", "chunked_attention", "full_attention"]),
                                 "layer_types"),
    ("gemma2", "no window"): (_set(sliding_window=None), "sliding_window"),
    ("gemma2", "bidirectional"): (_set(use_bidirectional_attention=True), "use_bidirectional_attention"),
}


@pytest.mark.parametrize("case", sorted(REFUSED), ids=lambda case: f"{case[0]}-{case[1]}")
def test_unsupported_settings_are_refused_by_name(checkpoints, tmp_path, case):
    assert_refused(checkpoints[case[0]], tmp_path, *REFUSED[case])


@pytest.mark.parametrize("cap", [-1.0, math.nan, math.inf])
def test_an_attention_cap_that_is_negative_or_not_finite_is_a_checkpoint_error(checkpoints, cap):
    arch = load_checkpoint(checkpoints["gemma2"]).architecture
    with pytest.raises(CheckpointError, match="attention_softcap"):
        dataclasses.replace(arch, attention_softcap=cap)


def test_an_attention_cap_with_sinks_is_refused(checkpoints):
    arch = load_checkpoint(checkpoints["gemma2"]).architecture
    with pytest.raises(CheckpointError, match="attention_softcap"):
        dataclasses.replace(arch, attention_sinks=True)


def test_gemma1_hidden_activation_naming_the_same_function_is_accepted(checkpoints, tmp_path):
    directory = rewritten_checkpoint(checkpoints["gemma"], tmp_path, _set(hidden_activation="gelu_pytorch_tanh"))
    assert load_checkpoint(directory).architecture == load_checkpoint(checkpoints["gemma"]).architecture
    assert json.loads((directory / "config.json").read_text())["hidden_activation"] == "gelu_pytorch_tanh"

"""The Phi-3 recipe against transformers' Phi3ForCausalLM on tiny random float32 checkpoints.

Phi-3-mini's shape (untied, whole-head rotary, a sliding window) and Phi-4-mini's (tied, partial
rotary 0.75, LongRoPE): prefill logits, scored log-probabilities and greedy tokens equal the
reference's (test_equivalence's checks and tolerances). LongRoPE's static rule: a core served at most
``original_max_position_embeddings`` tokens holds the short factors (the reference's on every such
sequence), a longer one the long factors (the reference's on a prompt longer than the original
context) and says so. The legacy config.json spellings prepare the same model; malformed rope
settings are refused by name.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.capture import capture_program, load_program
from helios.ignition.program_spec import Operation
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

from . import test_equivalence as equivalence
from .conftest import CHECK_OPERATIONS, PAGE_TOKENS, VARIANTS, Prepared
from .driver import PagedModel, RowWork, Sequence, generate
from .hf_checkpoints import (LONGROPE_LONG, LONGROPE_SHORT, PHI35_LONG, PHI3_MINI, PHI4_MINI, random_model,
                             rewritten_checkpoint, write_checkpoint)

ORIGINAL = 16


@pytest.fixture(scope="module", params=(PHI3_MINI, PHI4_MINI), ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_fused_checkpoint_tensors_are_the_prepared_layout(prepared):
    """qkv_proj rows are q, k, v and gate_up_proj rows gate, up: the prepared slots as they are, but for
    partial rotary, whose q/k rows are reordered within each head (values untouched)."""
    weights, layer = dict(prepared.recipe.weights), prepared.reference.model.layers[1]
    arch = prepared.recipe.architecture
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert torch.equal(weights["layers.1.gate_up.weight"], layer.mlp.gate_up_proj.weight)
    qkv = layer.self_attn.qkv_proj.weight
    if prepared.family is PHI3_MINI:
        assert arch.layer_windows == (6, 6) and not arch.tie_word_embeddings and arch.rotary_factor == 1.0
        assert torch.equal(weights["layers.1.qkv.weight"], qkv)
        assert torch.equal(weights["rope.inv_freq"], prepared.reference.model.rotary_emb.inv_freq)
    else:
        assert arch.layer_windows == (0, 0) and arch.tie_word_embeddings
        values = arch.q_size + arch.kv_size  # the v rows: not reordered
        assert torch.equal(weights["layers.1.qkv.weight"][values:], qkv[values:])
        rotary = prepared.reference.model.rotary_emb
        assert torch.equal(weights["rope.inv_freq"][:6], rotary.inv_freq) and not weights["rope.inv_freq"][6:].any()
        # max_position_embeddings 512 over the original 128: factor 4
        expected = math.sqrt(1 + math.log(4) / math.log(128))
        assert arch.rotary_factor == rotary.attention_scaling == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------------
# LongRoPE: the factor list by the served context.


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory):
    reference = random_model(PHI35_LONG, seed=5)
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    return reference, write_checkpoint(reference, tmp_path_factory.mktemp(PHI35_LONG.name))


_CAPTURED: dict = {}  # {Architecture: (captured, programs)}


def _programs(recipe):
    """The CHECK_OPERATIONS programs (every generation step runs MIXED, as in the family checks), captured
    once per architecture: the served context chooses the factor list, a weight (``rope.inv_freq``), and
    both contexts' recipes share the architecture the programs are built from."""
    arch = recipe.architecture
    if arch not in _CAPTURED:
        captured = {op: capture_program(arch, op, capacity, PAGE_TOKENS) for op, capacity in VARIANTS
                    if op in CHECK_OPERATIONS}
        _CAPTURED[arch] = captured, {op: (program.spec, load_program(program.program))
                                     for op, program in captured.items()}
    captured, programs = _CAPTURED[arch]
    return Prepared(PHI35_LONG, None, recipe, captured, programs)


def test_the_served_context_chooses_the_factor_list(long_checkpoint):
    reference, directory = long_checkpoint
    rotary = reference.model.rotary_emb
    long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](reference.config, seq_len=ORIGINAL + 1)
    for context, expected in ((None, rotary.original_inv_freq), (ORIGINAL, rotary.original_inv_freq),
                              (ORIGINAL + 1, long_freq)):
        recipe = load_checkpoint(directory, context_tokens=context)
        assert torch.equal(dict(recipe.weights)["rope.inv_freq"], expected)
        assert recipe.architecture.rotary_factor == rotary.attention_scaling
        assert bool(recipe.notices) == (context == ORIGINAL + 1)
    assert not torch.equal(long_freq, rotary.original_inv_freq)
    (notice,) = recipe.notices
    assert "long_factor" in notice and f"original_max_position_embeddings ({ORIGINAL})" in notice


def test_a_phi3_draft_takes_the_factor_list_of_the_served_context(long_checkpoint):
    from helios.ignition.speculative_plan import SpeculativePlan, load_draft

    reference, directory = long_checkpoint
    target = load_checkpoint(directory).architecture
    long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](reference.config, seq_len=ORIGINAL + 1)
    draft = load_draft(SpeculativePlan(draft=directory), target, context_tokens=64)
    assert torch.equal(dict(draft.weights)["rope.inv_freq"], long_freq) and draft.notices


def test_a_core_within_the_original_context_equals_the_reference_on_every_sequence(long_checkpoint):
    """Served context 16: a 9-token prompt and 7 new tokens reach position 15, the last one the
    reference still rotates with the short factors."""
    reference, directory = long_checkpoint
    prepared = _programs(load_checkpoint(directory, context_tokens=ORIGINAL))
    prompt = equivalence.random_prompt(9, seed=21)
    sequence = Sequence(0, list(prompt))
    generate(PagedModel(prepared.recipe.weight_tensors, prepared.programs), [sequence], ORIGINAL - 9, chunk=4)
    tokens, logits = _reference_greedy(reference, prompt, ORIGINAL - 9)
    assert sequence.generated == tokens
    assert equivalence.relative_error(torch.stack(sequence.logits), logits) < equivalence.TOLERANCE


def test_a_core_past_the_original_context_equals_the_reference_on_longer_prompts(long_checkpoint):
    """Served context 64: a 20-token prompt (past the original 16) is the reference's long-factor
    model in its prefill and every step after, scored or generated in chunks."""
    reference, directory = long_checkpoint
    prepared = _programs(load_checkpoint(directory, context_tokens=64))
    prompt = equivalence.random_prompt(20, seed=22)
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    scored = Sequence(0, list(prompt))
    model.admit(scored, len(prompt))
    outputs = model.run(Operation.SCORED_PREFILL, [RowWork(scored, tuple(prompt), 0, sample=True,
                                                           targets=tuple(prompt[1:]) + (7,))])
    with torch.no_grad():
        full = reference(torch.tensor([prompt])).logits[0]
    expected = torch.log_softmax(full, dim=-1)[torch.arange(len(prompt)), torch.tensor(prompt[1:] + [7])]
    assert equivalence.relative_error(outputs["target_logprobs"][:len(prompt)], expected) < equivalence.TOLERANCE
    assert equivalence.relative_error(outputs["logits"][0], full[-1]) < equivalence.TOLERANCE
    sequence = Sequence(1, list(prompt))
    generate(model, [sequence], 24, chunk=8)
    tokens, logits = _reference_greedy(reference, prompt, 24)
    assert sequence.generated == tokens
    assert equivalence.relative_error(torch.stack(sequence.logits), logits) < equivalence.TOLERANCE


def _reference_greedy(reference, prompt: list[int], new_tokens: int):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


def _legacy(kind: str):
    """Phi-4-mini's own config.json: rope_scaling with ``type``, rope_theta and partial_rotary_factor
    at the top level."""
    def edit(config):
        rope = config.pop("rope_parameters")
        config.update(rope_theta=rope["rope_theta"], partial_rotary_factor=0.75, rope_scaling={
            "type": kind, "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]})
    return edit


@pytest.mark.parametrize("kind", ["longrope", "su", "yarn"])  # Phi3Config reads the legacy two as longrope
def test_the_legacy_layout_prepares_the_same_model(tmp_path, kind):
    directory = write_checkpoint(random_model(PHI4_MINI), tmp_path / "current")
    current = load_checkpoint(directory)
    legacy = load_checkpoint(rewritten_checkpoint(directory, tmp_path, _legacy(kind)))
    assert legacy.architecture == current.architecture
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(legacy.weights, current.weights))


def test_a_missing_original_context_is_the_references_default(long_checkpoint, tmp_path):
    """Phi3Config's top-level original_max_position_embeddings (4096 when config.json leaves it out)
    overrides the rope dict's own: the attention factor and the factor list follow it."""
    directory = rewritten_checkpoint(long_checkpoint[1], tmp_path, lambda config: config.pop("original_max_position_embeddings"))
    config = transformers.AutoConfig.from_pretrained(directory)
    assert config.rope_parameters["original_max_position_embeddings"] == 4096
    scaling = ROPE_INIT_FUNCTIONS["longrope"](config)[1]
    recipe = load_checkpoint(directory, context_tokens=4096)
    assert recipe.architecture.rotary_factor == pytest.approx(scaling) and not recipe.notices


def _rope(edit):
    def apply(config):
        edit(config["rope_parameters"])
    return apply


REFUSED = {
    "short list too short": (_rope(lambda rope: rope.update(short_factor=LONGROPE_SHORT[:7])), "short_factor"),
    "long list too long": (_rope(lambda rope: rope.update(long_factor=LONGROPE_LONG + [2.0])), "long_factor"),
    "no short list": (_rope(lambda rope: rope.pop("short_factor")), "short_factor"),
    "a list of strings": (_rope(lambda rope: rope.update(long_factor=["1.0"] * 8)), "long_factor"),
    "a zero factor": (_rope(lambda rope: rope.update(long_factor=[0.0] * 8)), "long_factor"),
    "null original context": (lambda config: config.update(original_max_position_embeddings=None),
                              "original_max_position_embeddings"),
    "an original context of 1": (lambda config: config.update(original_max_position_embeddings=1),
                                 "original_max_position_embeddings"),
    "linear rope": (_rope(lambda rope: rope.update(rope_type="linear", factor=2.0)), "rope_type"),
    "an odd rotary width": (_rope(lambda rope: rope.update(partial_rotary_factor=0.1)), "partial_rotary_factor"),
    "gelu": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    "a window of 0": (lambda config: config.update(sliding_window=0), "sliding_window"),
    "null head_dim": (lambda config: config.update(head_dim=None), "head_dim"),
    "null norm epsilon": (lambda config: config.update(rms_norm_eps=None), "rms_norm_eps"),
    "no context for the factor": (lambda config: config.update(max_position_embeddings=None),
                                  "max_position_embeddings"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_malformed_phi3_settings_are_refused_by_name(long_checkpoint, tmp_path, case):
    edit, setting = REFUSED[case]
    directory = rewritten_checkpoint(long_checkpoint[1], tmp_path, edit)
    with pytest.raises(UnsupportedCheckpoint, match=setting):
        load_checkpoint(directory, context_tokens=64)


@pytest.mark.parametrize("case", ["short list too short", "long list too long", "linear rope"])
def test_the_reference_refuses_them_too(long_checkpoint, tmp_path, case):
    directory = rewritten_checkpoint(long_checkpoint[1], tmp_path, REFUSED[case][0])
    with pytest.raises(Exception, match="factor|type"):
        transformers.AutoConfig.from_pretrained(directory)


def test_a_fused_projection_of_the_wrong_shape_is_refused(long_checkpoint, tmp_path):
    directory = rewritten_checkpoint(long_checkpoint[1], tmp_path, lambda config: config.update(num_key_value_heads=4))
    with pytest.raises(CheckpointError, match="qkv_proj"):
        load_checkpoint(directory)


# ---------------------------------------------------------------------------------------------------
# The released shapes (config values only, no weights): Phi-3.5-mini (head_dim 96, whole-head
# rotary), Phi-4-mini (head_dim 128, 0.75 of it rotated), Phi-3-medium-128k (head_dim 128, GQA).

_RELEASED = {
    "phi3.5-mini": dict(hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, pairs=48),
    "phi4-mini": dict(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8, pairs=48,
                      partial_rotary_factor=0.75),
    "phi3-medium-128k": dict(hidden_size=5120, num_attention_heads=40, num_key_value_heads=10, pairs=64),
}


@pytest.mark.parametrize("name", sorted(_RELEASED))
@pytest.mark.parametrize("context", [4096, 131072])
def test_released_shapes_get_the_references_rotary_tables(name, context):
    from helios.ignition.recipes.defaults import with_reference_defaults
    from helios.ignition.recipes.phi3 import rope_from_config

    shape = dict(_RELEASED[name])
    pairs = shape.pop("pairs")
    generator = torch.Generator().manual_seed(pairs)
    rope = {"type": "longrope", "short_factor": (1 + 0.1 * torch.rand(pairs, generator=generator)).tolist(),
            "long_factor": (1 + 60 * torch.rand(pairs, generator=generator)).tolist()}
    config = dict(shape, vocab_size=32064, intermediate_size=8192, num_hidden_layers=32, rope_theta=10000.0,
                  max_position_embeddings=131072, original_max_position_embeddings=4096, rope_scaling=rope)
    reference = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(transformers.Phi3Config(**config))
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    ours, notices = rope_from_config(with_reference_defaults("Phi3ForCausalLM", config), head_dim, context)
    long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](reference.config, seq_len=context)
    expected = long_freq if context > 4096 else reference.original_inv_freq
    assert torch.equal(ours.inv_freq, expected) and ours.rotary == 2 * pairs
    assert ours.attention_factor == reference.attention_scaling == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096)))
    assert bool(notices) == (context > 4096)

"""The Granite 4.0 hybrid recipe (GraniteMoeHybridForCausalLM) against transformers on tiny random
float32 checkpoints with every Granite multiplier away from 1 (tests/ignition/hf_checkpoints.py):
Mamba2 mixers in layers 0 and 2, attention in layer 1; experts with the shared MLP and rotary
attention, or a dense shared MLP and attention without positions.

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in
chunks (crossing the reference's Mamba2 chunk of 8 tokens) and decoded with the carried state, and
for a continuous batch of different lengths; a decoder whose layers all attend prepares a plain
decoder with the reference's logits; the layout folds the multipliers; unsupported settings are
refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.capture import capture_program, load_program
from helios.ignition.program_spec import Capacity, Operation
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from support.bamba_reference import grouped_gated_norm
from support.sweeps import swept

from . import test_equivalence as equivalence
from .conftest import PAGE_TOKENS, single_thread
from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import (GRANITE_HYBRID, GRANITE_HYBRID_DENSE, GRANITE_HYBRID_FAMILIES, Family, assert_refused,
                             random_model, rewritten_checkpoint, write_checkpoint)

VARIANTS = ((Operation.PREFILL, Capacity(2, 32)), (Operation.DECODE, Capacity(4, 4)),
            (Operation.MIXED, Capacity(4, 32)))
# What a hybrid family's checks capture: its prompt chunks run through MIXED, its decode steps through DECODE. A
# hybrid PREFILL program is MIXED's decoder path (`helios.ignition.hybrid_program`: the same recurrent body, the
# mixers scan up to the packed tokens; only DECODE runs their one-token step). HELIOS_EQUIVALENCE_SWEEP=1 captures
# every hybrid family's PREFILL program too; by default test_config_fuzz_served serves Bamba's hybrid PREFILL
# programs on the C++ kernels against transformers, and test_config_fuzz runs each drawn hybrid's eager PREFILL.
CHECK_VARIANTS = VARIANTS if swept("HELIOS_EQUIVALENCE_SWEEP") else VARIANTS[1:]


@dataclasses.dataclass
class Prepared:
    family: Family
    reference: torch.nn.Module
    recipe: object
    programs: dict
    directory: object


_PREPARED: dict[str, Prepared] = {}


def prepared_once(family: Family, tmp_path_factory) -> Prepared:
    """`prepare_hybrid(family)` once per worker: the modules' fixtures that ask for one family share it."""
    if family.name not in _PREPARED:
        _PREPARED[family.name] = prepare_hybrid(family, tmp_path_factory.mktemp(family.name))
    return _PREPARED[family.name]


def prepare_hybrid(family: Family, base, variants=None) -> Prepared:
    """`family`'s reference (Mamba2's grouped gated norm, no EOS), its checkpoint, recipe and
    captured `variants` (a hybrid core has no SCORED_PREFILL program; default: CHECK_VARIANTS)."""
    if variants is None:
        variants = CHECK_VARIANTS
    with single_thread():
        reference = random_model(family)
        grouped_gated_norm(reference)
        reference.generation_config.eos_token_id = None
        reference.generation_config.pad_token_id = 0
        directory = write_checkpoint(reference, base / family.name)
        recipe = load_checkpoint(directory)
        captured = {op: capture_program(recipe.architecture, op, capacity, PAGE_TOKENS) for op, capacity in variants}
        programs = {op: (program.spec, load_program(program.program)) for op, program in captured.items()}
    return Prepared(family, reference, recipe, programs, directory)


@pytest.fixture(scope="module", params=GRANITE_HYBRID_FAMILIES, ids=lambda family: family.name)
def prepared(request, tmp_path_factory):
    return prepare_hybrid(request.param, tmp_path_factory.mktemp("granite-hybrid"))


def assert_chunked_prompt_matches(prepared: Prepared) -> None:
    """A 19-token prompt prefilled in three chunks (across the reference's Mamba2 chunk of 8, the
    state carried between them), then 64 decode steps: transformers' greedy tokens and logits."""
    prompt = equivalence.random_prompt(19, seed=3)
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequence = Sequence(0, list(prompt))
    generate(model, [sequence], equivalence.NEW_TOKENS, chunk=7)
    assert model.operations_run[:3] == [model.variant(Operation.PREFILL)] * 3
    assert set(model.operations_run[3:]) == {Operation.DECODE}
    equivalence.assert_matches_reference(prepared, sequence, prompt)


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(prepared):
    assert_chunked_prompt_matches(prepared)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


def test_the_prepared_layout_folds_the_multipliers(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    state = prepared.reference.state_dict()
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    assert arch.recurrent.layers == (0, 2) and arch.attention_layers == (1,) and arch.rotary_width == 16
    assert arch.embedding_scale == 4.0 and arch.attention_scale == pytest.approx(0.2, rel=1e-15)
    assert torch.equal(weights["layers.1.o.weight"], state["model.layers.1.self_attn.o_proj.weight"] * 0.5)
    assert torch.equal(weights["layers.2.mixer.out.weight"], state["model.layers.2.mamba.out_proj.weight"] * 0.5)
    assert torch.equal(weights["final_norm"], state["model.norm.weight"] / 2.5)
    torch.testing.assert_close(weights["layers.0.mixer.A"], -torch.exp(state["model.layers.0.mamba.A_log"]))
    shared = "model.layers.2.shared_mlp."
    if prepared.family is GRANITE_HYBRID:
        assert arch.moe == MixtureOfExperts(4, 2, 32, (0, 1, 2), scoring="topk_softmax", shared_intermediate_size=48)
        assert arch.intermediate_size == 0 and arch.qkv_bias and arch.o_bias and arch.recurrent.num_groups == 2
        experts = "model.layers.2.block_sparse_moe.experts."
        assert torch.equal(weights["layers.2.experts.gate_up"], state[experts + "gate_up_proj"])
        assert torch.equal(weights["layers.2.experts.down"], state[experts + "down_proj"] * 0.5)
        assert torch.equal(weights["layers.2.shared.down.weight"], state[shared + "output_linear.weight"] * 0.5)
        assert torch.equal(weights["rope.inv_freq"], prepared.reference.model.rotary_emb.inv_freq)
    else:
        assert arch.moe is None and arch.intermediate_size == 96 and arch.tie_word_embeddings
        assert arch.recurrent.proj_bias and arch.recurrent.out_bias
        assert not torch.any(weights["layers.0.mixer.conv.bias"])
        assert torch.equal(weights["layers.2.gate_up.weight"], state[shared + "input_linear.weight"])
        assert torch.equal(weights["layers.2.down.weight"], state[shared + "output_linear.weight"] * 0.5)
        assert torch.equal(weights["layers.0.mixer.out.bias"], state["model.layers.0.mamba.out_proj.bias"] * 0.5)
        assert not torch.any(weights["rope.inv_freq"])  # no positions: the rotation is the identity


def test_a_decoder_whose_layers_all_attend_is_a_plain_decoder(tmp_path):
    """Granite 4.0 Micro's shape: every layer attends (rotary), the experts and shared MLP as above."""
    family = dataclasses.replace(GRANITE_HYBRID, name="granite_hybrid_attention", overrides=(
        *GRANITE_HYBRID.overrides, ("layer_types", ["attention"] * 3)))
    reference = random_model(family)
    recipe = load_checkpoint(write_checkpoint(reference, tmp_path / "checkpoint"))
    assert recipe.architecture.recurrent is None and recipe.architecture.moe.sparse_layers == (0, 1, 2)
    prompt = equivalence.random_prompt(11, seed=5)
    ours = equivalence.prefill_logits(recipe.architecture, recipe.weight_tensors, prompt)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    assert equivalence.relative_error(ours, expected) < equivalence.TOLERANCE


def test_experts_without_a_shared_mlp(tmp_path):
    """shared_intermediate_size 0 beside experts: transformers saves a zero-wide shared_mlp (its output is
    zeros), which the recipe leaves unplaced instead of refusing the checkpoint (the hybrid fuzz found it)."""
    family = dataclasses.replace(GRANITE_HYBRID, name="granite_hybrid_unshared", overrides=(
        *GRANITE_HYBRID.overrides, ("shared_intermediate_size", 0)))
    reference = random_model(family)
    recipe = load_checkpoint(write_checkpoint(reference, tmp_path / "checkpoint"))
    assert recipe.architecture.moe.shared_intermediate_size == 0
    prompt = equivalence.random_prompt(11, seed=5)
    ours = equivalence.prefill_logits(recipe.architecture, recipe.weight_tensors, prompt)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    assert equivalence.relative_error(ours, expected) < equivalence.TOLERANCE


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.GraniteMoeHybridConfig()
    for key, value in REFERENCE_DEFAULTS["GraniteMoeHybridForCausalLM"].items():
        assert value == getattr(reference, key), key


REFUSED = {
    "a layer kind": (dict(layer_types=["mamba", "sliding_attention", "mamba"]), "layer_types"),
    "no attention layer": (dict(layer_types=["mamba"] * 3), "layer_types"),
    "too few layer kinds": (dict(layer_types=["mamba", "attention"]), "layer_types"),
    "a position type": (dict(position_embedding_type="alibi"), "position_embedding_type"),
    "partial rotary": (dict(position_embedding_type="rope", rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "a rope type": (dict(position_embedding_type="rope", rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}), "rope_type"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "no MLP": (dict(shared_intermediate_size=0), "shared_intermediate_size"),
    "null head_dim": (dict(head_dim=None), "head_dim"),
    "a zero embedding multiplier": (dict(embedding_multiplier=0.0), "embedding_multiplier"),
    "mamba heads": (dict(mamba_n_heads=3), "mamba heads"),
}


@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GRANITE_HYBRID_DENSE), tmp_path_factory.mktemp("granite-hybrid-checkpoint"))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_settings_are_refused_by_name(dense_checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(dense_checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)


def test_the_legacy_layer_kind_spellings_prepare_the_same_model(dense_checkpoint, tmp_path):
    """config.json's ``layers_block_type`` key and the released "mamba" / "attention" names."""
    expected = load_checkpoint(dense_checkpoint).architecture
    assert load_checkpoint(dense_checkpoint).architecture.recurrent.layers == (0, 2)

    def edit(config):
        config["layers_block_type"] = ["mamba", "attention", "mamba"]
        del config["layer_types"]

    assert load_checkpoint(rewritten_checkpoint(dense_checkpoint, tmp_path, edit)).architecture == expected

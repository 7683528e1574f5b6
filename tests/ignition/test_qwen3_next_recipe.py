"""Qwen3-Next (Qwen3NextForCausalLM) and the Qwen3.5 text decoders (Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM): captured hybrid programs against transformers (float32) - greedy tokens and
logits of a chunked prompt, a continuous batch of different lengths - the prepared layout, the
config classes' layer kinds, sparse layers and defaults, and refusals by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.capture import capture_program, load_program
from helios.ignition.program_spec import Operation
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.recipes.qwen3_next import layer_kinds
from helios.ignition.recurrent_geometry import GatedDeltaNetGeometry
from helios.ignition.sharding import rank_architecture

from . import test_equivalence as equivalence
from .conftest import PAGE_TOKENS, single_thread
from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import QWEN3_5, QWEN3_5_MOE, QWEN3_NEXT, random_model, rewritten_checkpoint, write_checkpoint
from .test_equivalence import NEW_TOKENS, assert_matches_reference, random_prompt
from .test_granitemoehybrid_recipe import CHECK_VARIANTS


@dataclasses.dataclass
class Prepared:
    reference: torch.nn.Module
    recipe: object
    programs: dict
    directory: object


_PREPARED: dict[str, Prepared] = {}


def _prepared(family, base) -> Prepared:
    """`family` prepared once per session (its reference, recipe and captured programs)."""
    if family.name in _PREPARED:
        return _PREPARED[family.name]
    with single_thread():
        reference = random_model(family)
        reference.generation_config.eos_token_id = None
        reference.generation_config.pad_token_id = 0
        directory = write_checkpoint(reference, base / family.name)
        recipe = load_checkpoint(directory)
        captured = {op: capture_program(recipe.architecture, op, capacity, PAGE_TOKENS)
                    for op, capacity in CHECK_VARIANTS}
        programs = {op: (program.spec, load_program(program.program)) for op, program in captured.items()}
    _PREPARED[family.name] = Prepared(reference, recipe, programs, directory)
    return _PREPARED[family.name]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return _prepared(QWEN3_NEXT, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module", params=[QWEN3_5, QWEN3_5_MOE], ids=lambda family: family.name)
def qwen3_5(request, tmp_path_factory):
    """A Qwen3.5 family's reference and recipe (its programs are Qwen3-Next's: the configuration fuzz's
    Qwen3.5 draws run them against transformers)."""
    reference = random_model(request.param)
    directory = write_checkpoint(reference, tmp_path_factory.mktemp(request.param.name))
    return Prepared(reference, load_checkpoint(directory), {}, directory)


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(prepared):
    prompt = random_prompt(13, seed=3)
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequence = Sequence(0, list(prompt))
    generate(model, [sequence], NEW_TOKENS, chunk=5)  # the prompt in three chunks: state carried between
    assert model.operations_run[:3] == [model.variant(Operation.PREFILL)] * 3
    assert set(model.operations_run[3:]) == {Operation.DECODE}
    assert_matches_reference(prepared, sequence, prompt)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


def test_the_prepared_layout(prepared):
    arch = prepared.recipe.architecture
    assert arch.recurrent == GatedDeltaNetGeometry(layers=(0, 2), num_key_heads=2, num_value_heads=4, key_head_dim=8,
                                                   value_head_dim=12, conv_kernel=4)
    assert arch.attention_layers == (1,) and arch.attention_gate and arch.qk_norm and arch.rotary_width == 8
    assert arch.moe.sparse_layers == (0, 2) and arch.moe.shared_gate and arch.intermediate_size == 96
    weights = {w.name: w.tensor for w in prepared.recipe.weights}
    assert [w.name for w in prepared.recipe.weights] == [slot.name for slot in weight_layout(arch)]
    state = prepared.reference.state_dict()
    # zero-centred norms fold (1 + w); the linear-attention output norm is a plain weight
    torch.testing.assert_close(weights["layers.1.q_norm"], 1 + state["model.layers.1.self_attn.q_norm.weight"])
    torch.testing.assert_close(weights["final_norm"], 1 + state["model.norm.weight"])
    assert torch.equal(weights["layers.0.delta.norm"], state["model.layers.0.linear_attn.norm.weight"])
    # q_proj's per-head [query, gate] rows: the queries lead qkv, the gates end it
    q_proj = state["model.layers.1.self_attn.q_proj.weight"].reshape(4, 2, 16, 64)
    assert torch.equal(weights["layers.1.qkv.weight"][:64], q_proj[:, 0].reshape(64, 64))
    assert torch.equal(weights["layers.1.qkv.weight"][-64:], q_proj[:, 1].reshape(64, 64))
    # in_proj: per key head [q 8, k 8, v 24, z 24] and [b 2, a 2] regrouped into q | k | v | z | b | a
    qkvz = state["model.layers.2.linear_attn.in_proj_qkvz.weight"].reshape(2, 64, 64)
    ba = state["model.layers.2.linear_attn.in_proj_ba.weight"].reshape(2, 4, 64)
    expected = [qkvz[:, :8], qkvz[:, 8:16], qkvz[:, 16:40], qkvz[:, 40:], ba[:, :2], ba[:, 2:]]
    assert torch.equal(weights["layers.2.delta.in_proj.weight"], torch.cat([x.reshape(-1, 64) for x in expected]))
    torch.testing.assert_close(weights["layers.2.delta.A"], -torch.exp(state["model.layers.2.linear_attn.A_log"]))


def test_layer_kinds_and_sparse_layers_follow_the_config_class():
    for interval, layers in ((4, 8), (2, 5), (1, 3)):
        config = transformers.Qwen3NextConfig(num_hidden_layers=layers, full_attention_interval=interval)
        terse = {"num_hidden_layers": layers, "full_attention_interval": interval}
        if "linear_attention" in config.layer_types:
            assert list(layer_kinds(terse)) == config.layer_types
    with pytest.raises(UnsupportedCheckpoint, match="layer_types"):
        layer_kinds({"num_hidden_layers": 3, "full_attention_interval": 1})  # no linear-attention layer


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.Qwen3NextConfig()
    for key, value in REFERENCE_DEFAULTS["Qwen3NextForCausalLM"].items():
        expected = reference.rope_parameters[key] if key == "partial_rotary_factor" else getattr(reference, key)
        assert value == expected, key


def _edited(prepared, tmp_path, edit):
    return rewritten_checkpoint(prepared.directory, tmp_path, edit)


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c["rope_parameters"].update(rope_type="linear", factor=2.0), "rope_type"),
    (lambda c: c.update(layer_types=["linear_attention", "sliding_attention", "linear_attention"]), "layer_types"),
    (lambda c: c.update(layer_types=["linear_attention"] * 3), "layer_types"),
    (lambda c: c.update(shared_expert_intermediate_size=0), "shared_expert_intermediate_size"),
])
def test_unsupported_settings_are_refused_by_name(prepared, tmp_path, edit, named):
    with pytest.raises(UnsupportedCheckpoint, match=named):
        load_checkpoint(_edited(prepared, tmp_path, edit))


def test_ranks_split_key_heads_with_their_value_heads(prepared):
    """Two ranks: one key head and its two value heads each; four ranks: fewer key heads than ranks,
    refused naming linear_num_key_heads."""
    shard = rank_architecture(prepared.recipe.architecture, 2)
    assert (shard.recurrent.num_key_heads, shard.recurrent.num_value_heads) == (1, 2)
    assert shard.recurrent.state_shape == (2, 8, 12) and shard.recurrent.conv_dim == 8 + 8 + 24
    with pytest.raises(CheckpointError, match="linear_num_key_heads"):
        rank_architecture(prepared.recipe.architecture, 4)


def test_multi_token_prediction_tensors_are_skipped_and_others_refused(prepared, tmp_path):
    from safetensors.torch import load_file, save_file

    checkpoint = _edited(prepared, tmp_path, lambda c: None)
    tensors = load_file(checkpoint / "model.safetensors")
    save_file({**tensors, "mtp.fc.weight": torch.zeros(64, 128)}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})
    assert load_checkpoint(checkpoint).architecture == prepared.recipe.architecture
    save_file({**tensors, "model.layers.0.linear_attn.conv1d.bias": torch.zeros(80)},
              checkpoint / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedCheckpoint, match="conv1d.bias"):
        load_checkpoint(checkpoint)


def test_sparse_layers_follow_the_reference_decoder_layers():
    """decoder_sparse_step, mlp_only_layers and num_experts 0 pick the layers the reference makes sparse."""
    from helios.ignition.recipes.qwen3_next import mixture

    tiny = dict(hidden_size=16, intermediate_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=4, linear_value_head_dim=4,
                moe_intermediate_size=4, shared_expert_intermediate_size=4, num_experts_per_tok=1, vocab_size=8)
    for settings in (dict(decoder_sparse_step=2), dict(mlp_only_layers=[0, 3]), dict(num_experts=0),
                     dict(decoder_sparse_step=3, mlp_only_layers=[2])):
        config = transformers.Qwen3NextConfig(num_hidden_layers=5, num_experts=settings.pop("num_experts", 2),
                                              **tiny, **settings)
        model = transformers.Qwen3NextForCausalLM(config)
        sparse = tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts"))
        moe = mixture("Qwen3NextForCausalLM", config.to_dict(), 5)
        assert (moe.sparse_layers if moe else ()) == sparse, settings


def test_qwen3_5_layouts(qwen3_5):
    """Qwen3.5's whole projections are the prepared in_proj rows as they are; its MLPs are dense or
    sparse throughout (always renormalised routing)."""
    arch, state = qwen3_5.recipe.architecture, qwen3_5.reference.state_dict()
    kind = type(qwen3_5.reference).__name__
    assert arch.recurrent.layers == (0, 2) and arch.attention_gate and arch.rotary_width == 4
    weights = {w.name: w.tensor for w in qwen3_5.recipe.weights}
    parts = [state[f"model.layers.2.linear_attn.in_proj_{name}.weight"] for name in ("qkv", "z", "b", "a")]
    assert torch.equal(weights["layers.2.delta.in_proj.weight"], torch.cat(parts))
    if kind == "Qwen3_5ForCausalLM":
        assert arch.moe is None and arch.tie_word_embeddings and "lm_head" not in weights
    else:
        assert arch.moe.sparse_layers == (0, 1, 2) and arch.moe.normalize and arch.intermediate_size == 0


def test_the_three_architectures_are_supported():
    from helios.ignition.recipes import SUPPORTED_ARCHITECTURES

    assert {"Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)

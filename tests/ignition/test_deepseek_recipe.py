"""The DeepSeek-V3 recipe: architecture fields, YaRN arithmetic, de-interleaved rotary rows, the
paged latent region in the contract, tensor-parallel shards, and refusals.

Programs here run eagerly (`build_program`, no torch.export): test_equivalence covers the exported ones.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.capture import build_program
from helios.ignition.export import CapacityPlan
from helios.ignition.preparation.contract import (
    FrontendDeclaration, PagedTextDeclaration, ProgramResource, declare_paged_text,
)
from helios.ignition.program_spec import Capacity, Operation, program_spec
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint
from helios.ignition.sharding import rank_architecture, rank_weights
from helios.ignition.speculative_plan import DRAFT_WEIGHTS_RESOURCE, SpeculativePlan

from .driver import PagedModel, RowWork, Sequence
from .hf_checkpoints import DEEPSEEK, DEEPSEEK_DENSE, Family, random_model, write_checkpoint

PROMPT = [3, 17, 101, 5, 9, 64, 2, 88, 41, 7, 30]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{family name: (reference model, recipe)}"""
    out = {}
    for family in (DEEPSEEK, DEEPSEEK_DENSE):
        model = random_model(family)
        out[family.name] = (model, load_checkpoint(write_checkpoint(model, tmp_path_factory.mktemp(family.name))))
    return out


def eager_prefill_logits(recipe, prompt) -> torch.Tensor:
    """The last prompt token's logits from an eager PREFILL program through the test driver."""
    arch = recipe.architecture
    spec = program_spec(arch, Operation.PREFILL, Capacity(1, 16), 4)
    model = PagedModel(recipe.weight_tensors, {Operation.PREFILL: (spec, build_program(arch, Operation.PREFILL, 4))})
    sequence = Sequence(0, list(prompt))
    model.admit(sequence, len(prompt))
    return model.run(Operation.PREFILL, [RowWork(sequence, tuple(prompt), 0, sample=True)])["logits"][0]


def test_architecture_fields_come_from_the_config(built):
    model, recipe = built[DEEPSEEK.name]
    arch, config = recipe.architecture, model.config
    latent, experts = arch.latent, arch.moe
    assert (latent.kv_lora_rank, latent.q_lora_rank, latent.qk_nope_head_dim, latent.qk_rope_head_dim,
            latent.v_head_dim) == (32, 24, 16, 16, 24)
    assert (arch.head_dim, arch.num_heads, arch.num_kv_heads, arch.num_layers) == (16, 4, 4, 4)
    assert (experts.sparse_layers, experts.num_experts, experts.experts_per_token, experts.num_groups,
            experts.topk_groups) == ((2, 3), 8, 3, 4, 2)
    assert (experts.scoring, experts.normalize, experts.scale, experts.correction_bias) == ("sigmoid", True, 2.5, True)
    assert (experts.expert_intermediate_size, experts.shared_intermediate_size) == (32, 32)
    assert [arch.is_sparse(layer) for layer in range(4)] == [False, False, True, True]
    assert built[DEEPSEEK_DENSE.name][1].architecture.moe is None
    assert built[DEEPSEEK_DENSE.name][1].architecture.latent.q_lora_rank == 0
    assert config.rope_interleave


def test_yarn_frequencies_attention_factor_and_softmax_scale_equal_the_reference(built):
    model, recipe = built[DEEPSEEK.name]
    weights = dict(recipe.weights)
    rotary = model.model.rotary_emb
    assert torch.equal(weights["rope.inv_freq"], rotary.inv_freq)
    assert recipe.architecture.latent.rope_attention_factor == pytest.approx(rotary.attention_scaling, rel=1e-12)
    assert recipe.architecture.attention_scale == pytest.approx(model.model.layers[0].self_attn.scaling, rel=1e-12)
    assert recipe.architecture.latent.rope_attention_factor != 1.0  # mscale != mscale_all_dim: it matters here


def test_weights_follow_the_layout_with_rotary_rows_de_interleaved(built):
    model, recipe = built[DEEPSEEK.name]
    weights = dict(recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(recipe.architecture)]
    attention = model.model.layers[2].self_attn
    q_b = attention.q_b_proj.weight.view(4, 32, 24)
    ours = weights["layers.2.q_b.weight"].view(4, 32, 24)
    assert torch.equal(ours[:, :16], q_b[:, :16])  # no-rotary rows untouched
    assert torch.equal(ours[:, 16:24], q_b[:, 16::2]) and torch.equal(ours[:, 24:], q_b[:, 17::2])
    kv_a = attention.kv_a_proj_with_mqa.weight
    assert torch.equal(weights["layers.2.kv_a.weight"][32:40], kv_a[32::2])
    mlp = model.model.layers[3].mlp
    assert torch.equal(weights["layers.3.experts.down"][5], mlp.experts.down_proj[5])
    assert torch.equal(weights["layers.3.router.correction_bias"], mlp.gate.e_score_correction_bias)
    assert weights["layers.3.router.correction_bias"].abs().sum() > 0


def test_rotary_rows_that_are_not_interleaved_are_kept_and_still_match(tmp_path):
    family = Family("deepseek_halves", DEEPSEEK_DENSE.config_class,
                    DEEPSEEK_DENSE.overrides + (("rope_interleave", False),))
    model = random_model(family)
    recipe = load_checkpoint(write_checkpoint(model, tmp_path))
    assert torch.equal(dict(recipe.weights)["layers.0.q.weight"], model.model.layers[0].self_attn.q_proj.weight)
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0, -1]
    torch.testing.assert_close(eager_prefill_logits(recipe, PROMPT), expected, rtol=1e-4, atol=1e-4)


def test_contract_declares_paged_latent_regions_for_target_and_draft(built):
    recipe = built[DEEPSEEK.name][1]
    arch = recipe.architecture
    plan = CapacityPlan(page_tokens=4, context_tokens=32, prefill_tokens=16, decode_batches=(2,),
                        speculative=SpeculativePlan(Path("draft-is-given-directly"), widths=(2,)))
    options = plan.speculative.options(arch)
    programs = [ProgramResource(program_spec(arch, op, capacity, 4, options), f"p{i}")
                for i, (op, capacity) in enumerate(plan.variants()) if op is not Operation.TUNING]
    declaration = PagedTextDeclaration(
        served_id="test", cache_identity="sha256:" + "0" * 64, vocab_size=arch.vocab_size, page_tokens=4,
        context_tokens=32, prefill_tokens=16, max_concurrency=2, page_capacity=16, eos_token_ids=(1,),
        sampling=spb.SamplingDefaults(seed_policy=spb.SEED_POLICY_RANDOM),
        frontend=FrontendDeclaration(assistant_boundary=spb.AssistantBoundary(
            message_start="<s>", message_end="</s>", assistant_header="assistant\n")))
    prepared = declare_paged_text(declaration, programs, ["weights.rank0"], DRAFT_WEIGHTS_RESOURCE)
    regions = {r.name: (r.kind, list(r.planes)) for r in prepared.contract.model.cache.regions}
    assert regions["attention"] == (spb.HISTORY_KIND_PAGED_LATENT, ["latent_cache", "rope_cache"])
    assert regions["draft"] == (spb.HISTORY_KIND_PAGED_LATENT, ["draft_latent_cache", "draft_rope_cache"])
    shapes = {b.name: [d.size or -1 for d in b.shape] for b in prepared.manifest.buffers}
    assert shapes["latent_cache"] == [4, -1, 4, 32] and shapes["rope_cache"] == [4, -1, 4, 16]


def test_tensor_parallel_shards_reassemble(built):
    recipe = built[DEEPSEEK.name][1]
    whole = dict(recipe.weights)
    ranks = [dict(rank_weights(recipe, 2, rank)) for rank in range(2)]
    shard = rank_architecture(recipe.architecture, 2)
    assert (shard.num_heads, shard.moe.expert_intermediate_size, shard.moe.shared_intermediate_size) == (2, 16, 16)
    for name in ("layers.0.q_b.weight", "layers.1.kv_b.weight"):
        assert torch.equal(torch.cat([r[name] for r in ranks]), whole[name])
    for name in ("layers.0.q_a.weight", "layers.0.kv_a.weight", "layers.0.kv_a_norm", "layers.2.router.weight"):
        assert all(torch.equal(r[name], whole[name]) for r in ranks)
    assert torch.equal(torch.cat([r["layers.1.o.weight"] for r in ranks], dim=1), whole["layers.1.o.weight"])
    assert torch.equal(torch.cat([r["layers.2.experts.down"] for r in ranks], dim=2), whole["layers.2.experts.down"])
    gate_up = torch.cat([r["layers.3.experts.gate_up"].view(8, 2, 16, 64) for r in ranks], dim=2)
    assert torch.equal(gate_up.view(8, 64, 64), whole["layers.3.experts.gate_up"])
    shared = torch.cat([r["layers.3.shared.gate_up.weight"].view(2, 16, 64) for r in ranks], dim=1)
    assert torch.equal(shared.view(64, 64), whole["layers.3.shared.gate_up.weight"])


def test_uneven_expert_width_is_refused_by_name(built):
    arch = built[DEEPSEEK.name][1].architecture
    odd = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, expert_intermediate_size=33))
    with pytest.raises(CheckpointError, match="expert width"):
        rank_architecture(odd, 2)


@pytest.mark.parametrize("change,message", [
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}}, "rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_configs_are_refused(tmp_path, built, change, message):
    directory = write_checkpoint(built[DEEPSEEK_DENSE.name][0], tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(directory)


def test_unplaced_tensors_are_refused(tmp_path, built):
    from safetensors.torch import load_file, save_file

    directory = write_checkpoint(built[DEEPSEEK_DENSE.name][0], tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    tensors["model.layers.2.mlp.gate.weight"] = torch.zeros(2)  # a multi-token-prediction layer: skipped
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedCheckpoint, match="self_attn.extra.weight"):
        load_checkpoint(directory)
    del tensors["model.layers.0.self_attn.extra.weight"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    assert load_checkpoint(directory).architecture.num_layers == 2


def test_eager_programs_match_the_reference_with_experts(built):
    model, recipe = built[DEEPSEEK.name]
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0, -1]
    torch.testing.assert_close(eager_prefill_logits(recipe, PROMPT), expected, rtol=1e-4, atol=1e-4)


def test_every_layer_sparse_leaves_no_dense_width_to_cut(tmp_path):
    """first_k_dense_replace 0: no layer holds the dense MLP, so the config's intermediate_size (odd here)
    sizes nothing, and tensor parallelism does not refuse it."""
    family = Family("deepseek_all_sparse", DEEPSEEK.config_class,
                    DEEPSEEK.overrides + (("first_k_dense_replace", 0), ("intermediate_size", 97)))
    model = random_model(family)
    recipe = load_checkpoint(write_checkpoint(model, tmp_path))
    arch = recipe.architecture
    assert arch.moe.sparse_layers == (0, 1, 2, 3) and arch.intermediate_size == 0
    shard = rank_architecture(arch, 2)
    assert (shard.num_heads, shard.moe.expert_intermediate_size) == (2, 16)
    assert [w.name for w in rank_weights(recipe, 2, 1)] == [slot.name for slot in weight_layout(shard)]
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0, -1]
    torch.testing.assert_close(eager_prefill_logits(recipe, PROMPT), expected, rtol=1e-4, atol=1e-4)


def test_an_unused_dense_width_is_not_cut_but_a_used_one_is(built):
    """The sharding check reads intermediate_size only where some layer holds the dense MLP (a recipe that
    keeps the config's width beside sparse layers everywhere is not refused for it)."""
    arch = built[DEEPSEEK.name][1].architecture
    every_sparse = dataclasses.replace(arch, intermediate_size=97,
                                       moe=dataclasses.replace(arch.moe, sparse_layers=(0, 1, 2, 3)))
    assert not every_sparse.has_dense_mlp and rank_architecture(every_sparse, 2).intermediate_size == 0
    with pytest.raises(CheckpointError, match="intermediate_size"):
        rank_architecture(dataclasses.replace(arch, intermediate_size=97), 2)

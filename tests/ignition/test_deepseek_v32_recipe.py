"""DeepSeek-V3.2 (DeepseekV32ForCausalLM) and GLM-5 (GlmMoeDsaForCausalLM) against transformers on tiny
random float32 checkpoints: latent attention over the positions DeepSeek Sparse Attention's indexer
selects (`helios.ignition.token_indexer`).

``index_topk`` is 6 (GLM-5: 5), so the prompts here (up to 14 tokens) and their 16-32 greedy tokens are
truly sparse: a query keeps 6 of up to 46 positions. GLM-5's second layer reuses the first layer's
selection ("shared"), and its indexer rotates interleaved pairs. Prefill logits, scored
log-probabilities, greedy tokens (single, a continuous batch prefilled in chunks of 8 beside decode
rows, a prompt continuing from cached prefix pages) equal the reference's (test_equivalence's checks
and tolerances); selecting every position instead changes the logits (the selection matters); the
ops' tie rule and padding; hostile configs are refused with CheckpointError naming the option.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.capture import build_program
from helios.ignition.program_spec import Operation, ProgramOptions, program_spec
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint
from helios.ignition.sharding import rank_architecture
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime

from . import test_equivalence as equivalence
from .conftest import PAGE_TOKENS, VARIANTS, Prepared, single_thread
from .driver import PagedModel, Sequence, generate as generate_steps
from .hf_checkpoints import _YARN, Family, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import _prepared as prepared_core
from .test_llama_shaped_served import check_served

PRESSED_TOKENS = 30  # generated per request under cache pressure
# Random indexer configurations against transformers (suite: one; HELIOS_DSA_FUZZ_SEEDS=200 for a sweep).
FUZZ_SEEDS = int(os.environ.get("HELIOS_DSA_FUZZ_SEEDS", "1"))

_SHAPE = (
    ("num_hidden_layers", 2), ("num_key_value_heads", 4), ("q_lora_rank", 24), ("kv_lora_rank", 32),
    ("qk_rope_head_dim", 16), ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("n_routed_experts", 8),
    ("num_experts_per_tok", 3), ("moe_intermediate_size", 32), ("n_shared_experts", 1), ("rope_parameters", _YARN),
    ("tie_word_embeddings", False),
)
DEEPSEEK_V32 = Family("deepseek_v32", transformers.DeepseekV32Config, (
    *_SHAPE, ("first_k_dense_replace", 1), ("n_group", 4), ("topk_group", 2),
    ("index_topk", 6), ("index_head_dim", 24), ("index_n_heads", 16),
))
GLM5 = Family("glm_moe_dsa", transformers.GlmMoeDsaConfig, (
    *_SHAPE, ("mlp_layer_types", ["dense", "sparse"]), ("first_k_dense_replace", 1), ("n_group", 2), ("topk_group", 1),
    ("index_topk", 5), ("index_head_dim", 20), ("index_n_heads", 16), ("indexer_types", ["full", "shared"]),
))


@pytest.fixture(scope="module", params=[DEEPSEEK_V32, GLM5], ids=lambda family: family.name)
def prepared(request, tmp_path_factory):
    """The family's reference, recipe and eager programs (the served test below exports GLM-5's)."""
    with single_thread():
        return eager_prepared(request.param, tmp_path_factory.mktemp(request.param.name))


def eager_prepared(family: Family, directory) -> Prepared:
    reference = random_model(family)
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    recipe = load_checkpoint(write_checkpoint(reference, directory))
    arch = recipe.architecture
    programs = {op: (program_spec(arch, op, capacity, PAGE_TOKENS), build_program(arch, op, PAGE_TOKENS))
                for op, capacity in VARIANTS}
    return Prepared(family, reference, recipe, {}, programs)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on both families."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GLM5), tmp_path_factory.mktemp("glm_moe_dsa"))


def test_the_indexer_comes_from_the_config(prepared):
    arch = prepared.recipe.architecture
    indexer = arch.indexer
    glm = prepared.family is GLM5
    assert (indexer.topk, indexer.num_heads, indexer.head_dim, indexer.rope_dim) == \
        ((5, 16, 20, 16) if glm else (6, 16, 24, 16))
    assert indexer.layers == ((0,) if glm else (0, 1))
    assert list(dict(prepared.recipe.weights)) == [slot.name for slot in weight_layout(arch)]
    assert dict(prepared.recipe.weights)["layers.0.indexer.weights"].dtype == torch.float32
    index_cache = next(s for s in prepared.programs[Operation.DECODE][0].inputs if s.name == "index_cache")
    assert index_cache.shape[0] == len(indexer.layers) and index_cache.shape[-1] == indexer.head_dim


def test_the_selection_matters(prepared):
    """Attending to every position (a top-k past every prompt) gives other logits than the reference's."""
    arch = prepared.recipe.architecture
    dense = dataclasses.replace(arch, indexer=dataclasses.replace(arch.indexer, topk=64))
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(14, seed=9), arch=dense)


def test_ties_go_to_the_earlier_position_and_padding_selects_nothing():
    index_cache = torch.zeros(3, 2, 4)  # every key zero: every score ties at 0
    page_table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    query_start = torch.tensor([0, 2], dtype=torch.int32)
    positions = torch.tensor([4, 1, 0], dtype=torch.int64)  # the last token is padding
    q, weights = torch.randn(3, 2, 4), torch.rand(3, 2)
    selected = torch.ops.helios.index_topk(q, weights, index_cache, page_table, query_start, positions, 0.5, 3)
    assert selected.tolist() == [[0, 1, 2], [0, 1, -1], [-1, -1, -1]]
    index_cache.view(-1, 4)[2 * 2 + 1] = 1.0  # position 1 of the row (page 2, offset 1) now scores
    q, weights = torch.ones(3, 2, 4), torch.ones(3, 2)
    selected = torch.ops.helios.index_topk(q, weights, index_cache, page_table, query_start, positions, 0.5, 2)
    assert selected.tolist() == [[1, 0], [1, 0], [-1, -1]]


def test_index_keys_skip_padding_slots():
    index_cache = torch.full((2, 2, 3), 7.0)
    keys = torch.arange(9, dtype=torch.float32).view(3, 3)
    torch.ops.helios.index_key_write(index_cache, keys, torch.tensor([3, -1, 0]))
    assert index_cache.view(-1, 3).tolist() == [[6, 7, 8], [7, 7, 7], [7, 7, 7], [0, 1, 2]]


@pytest.mark.parametrize("change,message", [
    ({"index_topk": 0}, "index_topk"),
    ({"index_topk": -3}, "index_topk"),
    ({"index_n_heads": 0}, "index_n_heads"),
    ({"index_head_dim": 8}, "index_head_dim 8 is narrower"),
    ({"q_lora_rank": None}, "q_lora_rank"),
    ({"indexer_types": ["shared", "full"]}, "indexer_types"),
    ({"indexer_types": ["full", "sparse"]}, "indexer_types"),
    ({"indexer_types": ["full"]}, "indexer_types"),
    ({"index_topk_pattern": "FX", "indexer_types": None}, "index_topk_pattern"),
    ({"layer_types": ["full_attention"] * 2}, "layer_types"),
    ({"rope_interleave": False}, "rope_interleave"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
])
def test_hostile_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))


@pytest.mark.parametrize("schedule", [{"index_topk_pattern": "FS"}, {"index_topk_freq": 2, "index_skip_topk_offset": 1}])
def test_the_schedule_of_shared_layers_is_read_when_types_are_missing(checkpoint, tmp_path, schedule):
    """GlmMoeDsaConfig's derivation: a pattern, or full where max(i - offset + 1, 0) % freq is 0."""
    def edit(config):
        del config["indexer_types"]
        config.update(schedule)

    assert load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, edit)).architecture.indexer.layers == (0,)


def test_a_bfloat16_core_keeps_the_index_weights_float32(checkpoint):
    weights = dict(load_checkpoint(checkpoint, dtype="bfloat16").weights)
    assert weights["layers.0.indexer.weights"].dtype == torch.float32
    assert weights["layers.0.indexer.q.weight"].dtype == torch.bfloat16


def test_programs_without_a_selection_path_are_refused(checkpoint):
    arch = load_checkpoint(checkpoint).architecture
    with pytest.raises(CheckpointError, match="draft model"):
        program_spec(arch, Operation.PREFILL, VARIANTS[0][1], PAGE_TOKENS, ProgramOptions(draft=arch))


def test_the_architecture_refuses_indexers_that_do_not_fit(checkpoint):
    arch = load_checkpoint(checkpoint).architecture
    for change in ({"topk": 0}, {"num_heads": 0}, {"rope_dim": 8}, {"head_dim": 10}, {"layers": (1,)},
                   {"layers": (0, 2)}, {"layers": (1, 0)}):
        with pytest.raises(CheckpointError, match="indexer"):
            dataclasses.replace(arch, indexer=dataclasses.replace(arch.indexer, **change))


def test_two_ranks_hold_the_indexer_whole(checkpoint):
    """Each rank selects alike: the indexer's weights are replicated, its geometry unchanged."""
    recipe = load_checkpoint(checkpoint)
    assert rank_architecture(recipe.architecture, 2).indexer == recipe.architecture.indexer
    names = tuple(name for name, _ in recipe.weights if ".indexer." in name)
    assert len(names) == 5
    equivalence.assert_two_rank_shares(recipe, whole=names)


@pytest.fixture(scope="module")
def glm5_core(tmp_path_factory):
    """(reference, opened core) of GLM-5 (`check_served_core`'s preparation, MIXED included): both served tests'."""
    return prepared_core(tmp_path_factory.mktemp("glm5-served"), GLM5, mixed=True)


def test_a_served_core_batches_and_reuses_cached_prefixes(glm5_core):
    """GLM-5 (a shared layer, interleaved indexer rows) prepared into a signed core and served by the
    runtime: two batched prompts (20 tokens, and 37 past the 32-token prefill capacity: chunked) and a
    continuation of the longer one from the prefix cache give the reference's greedy tokens and
    logits, the index keys of the reused pages included (top-5 of up to 51 positions)."""
    check_served(*glm5_core)


def test_preempted_requests_keep_their_index_keys(glm5_core):
    """Eight pages of 8 tokens cannot hold three requests growing from 12 to 42 tokens at once:
    preemption, recomputed or offloaded to host pages and restored (the index plane with the
    latents), gives the reference's greedy tokens (top-5 of up to 42 positions)."""
    reference, core = glm5_core
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (12,), generator=generator).tolist() for _ in range(3)]
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=PRESSED_TOKENS,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
            expected.append(out[0, len(prompt):].tolist())
    for preemption in (PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD):
        options = RuntimeOptions(load=LoadOptions(cpu_kernels=True, num_pages=8),
                                 policy=SchedulerPolicy(preemption=preemption), host_pages=16)
        runtime = build_runtime(core, options)
        try:
            tokens = [list(r.token_ids) for r in generate(runtime.engine, prompts, PRESSED_TOKENS)]
            assert runtime.engine.scheduler.counters().preemptions > 0, preemption
        finally:
            runtime.close()
        assert tokens == expected, preemption


def _fuzz_family(seed: int) -> Family:
    """A random DeepSeek-V3.2 or GLM-5 shape: top-k 1-8, rotary split 8 or 16 of an index head up to 8
    wider, one to three layers (GLM-5: each after the first full or shared), dense then sparse MLPs,
    YaRN or the default rope. 16 or 32 index heads keep exact ties (every head ReLU'd to zero) rare."""
    rng = random.Random(seed)
    glm, layers, rope = rng.random() < 0.5, rng.randint(1, 3), rng.choice([8, 16])
    dense = rng.randint(0, layers)
    kinds = ["dense"] * dense + ["sparse"] * (layers - dense)
    overrides = dict(
        num_hidden_layers=layers, num_key_value_heads=4, q_lora_rank=rng.choice([16, 24]),
        kv_lora_rank=rng.choice([16, 32]), qk_rope_head_dim=rope, qk_nope_head_dim=rng.choice([8, 16]),
        v_head_dim=rng.choice([16, 24]), n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, n_group=1, topk_group=1, mlp_layer_types=kinds, first_k_dense_replace=dense,
        rope_parameters=rng.choice([_YARN, {"rope_type": "default", "rope_theta": 100.0}]),
        tie_word_embeddings=False, index_topk=rng.randint(1, 8), index_head_dim=rope + rng.choice([0, 4, 8]),
        index_n_heads=rng.choice([16, 32]))
    if glm:
        overrides["indexer_types"] = ["full"] + [rng.choice(["full", "shared"]) for _ in range(layers - 1)]
    config_class = transformers.GlmMoeDsaConfig if glm else transformers.DeepseekV32Config
    return Family(f"dsa_fuzz_{seed}", config_class, tuple(overrides.items()))


@pytest.mark.parametrize("seed", range(FUZZ_SEEDS))
def test_random_indexer_configs_match_transformers(seed, tmp_path):
    """Greedy tokens (a prompt of 4-20 tokens prefilled in chunks of 2-8, then 12 decode steps) and
    their logits equal transformers' for a random configuration (`_fuzz_family`)."""
    family = _fuzz_family(seed)
    with single_thread():
        prepared = eager_prepared(family, tmp_path)
        rng = random.Random(seed)
        prompt = equivalence.random_prompt(rng.randint(4, 20), seed=seed)
        sequence = Sequence(0, list(prompt))
        generate_steps(PagedModel(prepared.recipe.weight_tensors, prepared.programs), [sequence], 12,
                       chunk=rng.randint(2, 8))
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = prepared.reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                              do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert sequence.generated == out.sequences[0, len(prompt):].tolist(), family
    assert equivalence.relative_error(torch.stack(sequence.logits), torch.cat(out.logits)) < equivalence.TOLERANCE

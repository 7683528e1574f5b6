"""Speculative generation through the runtime gives exactly the target's output.

For a recipe family of each attention path at width 4 (widths 1, 2 and 4 for `ALL_WIDTHS` families; with
HELIOS_SPECULATIVE_SWEEP=1, every width and the `_SIBLINGS` and `_SAME_PATH` families too), with the target itself and a
truncated copy as the draft: greedy tokens equal ordinary decoding token for token (chunked prompts
interleave MIXED rounds with speculative ones). Also: device prefix allocation under a packed capacity
below the lanes' ceilings, sampled lanes with a draft equal to the target (identical samples, by the
shared counter-based draws), and history drafting on a copy-heavy prompt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.contract import StartupOptions
from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.offline import generate
from helios.runtime.records.sampling_params import GREEDY, SamplingParams
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from ignition.hf_checkpoints import (FAMILIES, GEMMA3_FAMILIES, GRANITE, HUNYUAN, LLAMA2, LLAMA3, LLAMA_SHAPED_FAMILIES,
                                     PHI3_FAMILIES, QWEN2, SMOLLM3_FAMILIES, random_model, write_checkpoint)
from ignition.hf_checkpoints import COHERE_FAMILIES, GLM4, OLMO_FAMILIES, PHI2, STARCODER2
from ignition.hf_checkpoints import ERNIE4_5_MOE, GRANITE_MOE_FAMILIES, HUNYUAN_MOE, OLMOE_FAMILIES, QWEN2_MOE
from ignition.hf_checkpoints import DEEPSEEK, DEEPSEEK_V2, DOTS1, GEMMA3, GPT_OSS, YOUTU
from ignition.hf_checkpoints import GEMMA_FAMILIES
from ignition.hf_checkpoints import DBRX, LLAMA4, MINIMAX_M2, PHIMOE
from ignition.hf_checkpoints import APERTUS, GPT_NEOX
from ignition.hf_checkpoints import AFMOE, CWM, EXAONE_MOE, FLEX_OLMO, GRANITE_MOE_SWA, GRANITE_SWA, JAIS2, JETMOE
from ignition.hf_checkpoints import NANOCHAT, SOLAR_OPEN

from support.sweeps import swept

from .support import eager_model, eager_runtime, truncated

PROMPTS = [[5, 9, 17, 3, 44, 2, 8], [1, 2, 3], list(range(10, 50))]  # the last is chunked (prefill 32)
MAX_TOKENS = 16  # past the chunked prompt's MIXED steps, at least three full rounds of width 4 a lane
UNUSED = Path("draft-is-given-directly")
# Session 58's dense and MoE families: AFMoE always (its output-gate rows follow the key/value rows the draft's
# last layer writes: the draft once read them as keys), the others (per-layer rope bases and sinks, the embedding
# norm, attention experts) only with HELIOS_SPECULATIVE_SWEEP=1, for the suite's time.
NEWER = (AFMOE,) + ((CWM, EXAONE_MOE, FLEX_OLMO, GRANITE_MOE_SWA, GRANITE_SWA, JAIS2, JETMOE, NANOCHAT, SOLAR_OPEN)
                    if swept("HELIOS_SPECULATIVE_SWEEP") else ())
# Widths 1 (no proposals) and 2 (one proposal a round) run the verification programs width 4 runs with fewer
# positions a lane: every family at width 4, and all three widths for these (plain grouped-query attention, latent
# attention with experts, sinks beside sliding windows, two rope tables under windows); every family with
# HELIOS_SPECULATIVE_SWEEP=1.
ALL_WIDTHS = frozenset({LLAMA3.name, DEEPSEEK.name, GPT_OSS.name, GEMMA3.name})


def plan(widths=(4,), allocate=False, per_lane=None, draft_tokens=None, context=128) -> CapacityPlan:
    speculative = SpeculativePlan(UNUSED, widths=widths, allocate_prefixes=allocate, packed_per_lane=per_lane,
                                  draft_tokens=draft_tokens)
    return CapacityPlan(page_tokens=4, context_tokens=context, prefill_tokens=32, decode_batches=(1, 4),
                        speculative=speculative)


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    cache = {}

    def get(family):
        if family.name not in cache:
            directory = write_checkpoint(random_model(family), tmp_path_factory.mktemp(family.name))
            cache[family.name] = load_checkpoint(directory)
        return cache[family.name]

    return get


def run(recipe, draft, capacity_plan, speculative=True, startup=StartupOptions(), prompts=PROMPTS,
        sampling=GREEDY, max_tokens=MAX_TOKENS):
    engine, counting = eager_runtime(eager_model(recipe, draft, capacity_plan, startup),
                                     SchedulerPolicy(speculative=speculative))
    results = generate(engine, prompts, max_tokens, sampling=sampling)
    assert all(r.finish_reason.name == "LENGTH" for r in results), [r.message for r in results]
    return [list(r.token_ids) for r in results], counting


SPECULATING_FAMILIES = (FAMILIES + PHI3_FAMILIES + SMOLLM3_FAMILIES + GEMMA3_FAMILIES + COHERE_FAMILIES
                        + (STARCODER2, PHI2)
                        + LLAMA_SHAPED_FAMILIES + (GRANITE, HUNYUAN, GLM4) + OLMO_FAMILIES + (QWEN2_MOE,)
                        + OLMOE_FAMILIES + GRANITE_MOE_FAMILIES + (HUNYUAN_MOE, ERNIE4_5_MOE)
                        + (DEEPSEEK_V2, DOTS1, YOUTU) + GEMMA_FAMILIES + (LLAMA4, MINIMAX_M2, DBRX, PHIMOE)
                        + (APERTUS, GPT_NEOX) + NEWER)
# Siblings of a family in the list whose draft writes and verification take its path, only with
# HELIOS_SPECULATIVE_SWEEP=1: Mistral (Llama 3's, windows as Gemma 3's and gpt-oss's), the tied SmolLM3 (SmolLM3's
# NoPE layers, biases as Llama 2's), the capped Gemma 3 (Gemma 3's, the final cap as Gemma 2's), the biased OLMoE
# (OLMoE's), Granite MoE (Granite MoE Shared's without its shared expert), Phi-4-mini (Phi-3's fused rows, partial
# rotary as Phi-2's), OLMo 3 (OLMo 2's whole-projection key norm, windows as Gemma 3's), Mixtral (Qwen3-MoE's experts)
# and Seed-OSS (q/k/v biases as Llama 2's).
_SIBLINGS = {"mistral", "smollm3-tied", "gemma3-capped", "olmoe-biased", "granite_moe", "phi4-mini", "olmo3",
             "mixtral", "seed_oss"}
# Families whose speculative path (the draft's key/value writes and the verification of W positions a lane through
# the paged attention kernels) a default family takes, only with HELIOS_SPECULATIVE_SWEEP=1 too: what sets them apart
# acts on each position alone (biases, norms, multipliers, logit scales, rope tables, expert routing), which
# tests/ignition/test_equivalence checks against transformers family by family. By default: full attention under
# rope (Llama 3; partial rotary and the parallel block: Phi-2) for Llama 2, Qwen3, Gemma, ERNIE 4.5, Granite,
# Hunyuan, OLMo 2, Apertus, Cohere, GLM-4, GPT-NeoX and MiniMax-M2; sliding windows (Qwen2, Gemma 3, gpt-oss,
# SmolLM3) for Phi-3, Cohere 2 and StarCoder2; experts beside dense layers (Qwen3-MoE, DeepSeek-V3, gpt-oss, AFMoE)
# for GLM-4-MoE, Qwen2-MoE, OLMoE, Granite MoE Shared, Hunyuan-MoE, ERNIE 4.5 MoE, dots1, PhiMoE and DBRX; latent
# attention (DeepSeek-V3) for DeepSeek-V2 and Youtu.
_SAME_PATH = {"llama2", "qwen3", "gemma", "ernie4_5", "granite", "hunyuan", "olmo2", "apertus", "cohere", "glm4",
              "gpt_neox", "minimax_m2", "phi3-mini", "cohere2", "starcoder2", "glm4_moe", "qwen2_moe", "olmoe",
              "granite_moe_shared", "hunyuan_moe", "ernie4_5_moe", "dots1", "phimoe", "dbrx", "deepseek_v2", "youtu"}
if not swept("HELIOS_SPECULATIVE_SWEEP"):
    SPECULATING_FAMILIES = tuple(family for family in SPECULATING_FAMILIES
                                 if family.name not in _SIBLINGS | _SAME_PATH)


@pytest.mark.parametrize("family", SPECULATING_FAMILIES, ids=lambda f: f.name)
def test_greedy_speculative_output_equals_ordinary_decoding(recipes, family):
    recipe = recipes(family)
    drafts = {"self": recipe, "truncated": truncated(recipe, 1)}
    expected, counting = run(recipe, recipe, plan(), speculative=False)
    assert counting.rounds == 0
    widths = (1, 2, 4) if family.name in ALL_WIDTHS or swept("HELIOS_SPECULATIVE_SWEEP") else (4,)
    for width in widths:
        for name, draft in drafts.items():
            tokens, counting = run(recipe, draft, plan((width,)))
            assert tokens == expected, (family.name, width, name)
            assert counting.rounds > 0
            if width == 1:
                assert counting.tokens_per_lane == 1.0  # width one draws no proposals
            elif name == "self":  # the target proposes its own tokens: every proposal survives
                assert counting.tokens_per_lane >= width - 0.5


@pytest.mark.parametrize("family", [LLAMA3, QWEN2], ids=lambda f: f.name)
def test_device_allocation_within_a_smaller_packed_capacity(recipes, family):
    recipe = recipes(family)
    expected, _ = run(recipe, recipe, plan(), speculative=False)
    for draft in (recipe, truncated(recipe, 1)):
        tokens, counting = run(recipe, draft, plan((4,), allocate=True, per_lane=2))
        assert tokens == expected
        assert counting.trimmed_rounds > 0  # ceilings of 4 per lane, P = 2 per lane


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.OFFLOAD])
def test_draft_history_survives_prefix_reuse_and_preemption(recipes, mode):
    # the draft's keys/values live in the same pages: reused, recomputed or offloaded with them
    recipe = recipes(QWEN2)
    draft = truncated(recipe, 1)
    shared = list(range(20, 44))  # six complete pages
    prompts = [shared + [5, 6], [9, 8, 7, 6, 5], shared + [7], shared[:10] + [3]]
    expected, _ = run(recipe, draft, plan(), speculative=False, prompts=prompts, max_tokens=30)
    model = eager_model(recipe, draft, plan((4,), context=64), num_pages=20)
    engine, counting = eager_runtime(model, SchedulerPolicy(preemption=mode), host_pages=32)
    first = generate(engine, prompts[:1], 30)  # publishes the shared pages
    rest = generate(engine, prompts[1:], 30)
    assert [list(r.token_ids) for r in first + rest] == expected
    counters = engine.scheduler.counters()
    assert counters.prefix_reused_tokens >= len(shared) and counters.preemptions > 0 and counting.rounds > 0


@pytest.mark.parametrize("width, drafts, allocate", [(3, 5, True), (4, 1, False)])
def test_draft_count_independent_of_width(recipes, width, drafts, allocate):
    # D > W - 1: a block of proposals of which a prefix is verified; D < W - 1: lanes offer D + 1
    recipe = recipes(LLAMA3)
    expected, _ = run(recipe, recipe, plan(), speculative=False)
    tokens, counting = run(recipe, recipe, plan((width,), allocate=allocate, draft_tokens=drafts))
    assert tokens == expected
    assert counting.tokens_per_lane >= min(drafts + 1, width) - 0.5


def test_sampled_lanes_with_the_target_as_draft_reproduce_ordinary_sampling(recipes):
    recipe = recipes(QWEN2)
    sampling = SamplingParams.from_packed((0.9, 20.0, 0.95, 0.0, 1.1, 0.2, 0.1), seed=1234)
    expected, _ = run(recipe, recipe, plan(), speculative=False, sampling=sampling)
    tokens, counting = run(recipe, recipe, plan((4,)), sampling=sampling)
    assert tokens == expected
    assert counting.tokens_per_lane > 3  # identical draft and target distributions: all accepted


def test_history_drafting_copies_candidates_and_keeps_the_output(recipes, tmp_path):
    recipe = recipes(LLAMA2)  # untied embeddings: its greedy output cycles through several tokens
    draft = load_checkpoint(write_checkpoint(random_model(LLAMA2, seed=9), tmp_path))  # an unrelated draft
    phrase = [7, 21, 33, 4, 90, 12, 5, 61]
    prompts = [phrase * 4 + phrase[:3]]
    expected, _ = run(recipe, draft, plan(), speculative=False, prompts=prompts, max_tokens=40)
    learned, plain = run(recipe, draft, plan((4,)), prompts=prompts, max_tokens=40)
    copied, drafting = run(recipe, draft, plan((4,)), prompts=prompts, max_tokens=40,
                           startup=StartupOptions(history_drafting=True))
    assert learned == copied == expected
    assert plain.accepted <= 2 < 10 <= drafting.accepted  # the unrelated draft rarely agrees; copies do

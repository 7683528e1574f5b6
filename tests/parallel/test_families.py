"""Two tensor-parallel ranks give the greedy tokens one rank gives (transformers' in float32: each
family's recipe tests compare one rank with transformers), for every recipe family, through the
runtime API (ranks as threads of this process: the same code path as processes, which
`test_generate_cli` covers)."""

from __future__ import annotations

import pytest

from helios.ignition.recipes import load_checkpoint
from helios.runtime.offline import generate
from ignition.hf_checkpoints import (BAMBA, BAMBA_ONE_GROUP, DEEPSEEK, DENSE_FAMILIES, GEMMA3_FAMILIES, GLM4_MOE,
                                     GPT_OSS, LLAMA3, PHI3_FAMILIES, QWEN3_MOE, SMOLLM3)
from ignition.hf_checkpoints import COHERE, GLM4, OLMO_FAMILIES, PHI2, STARCODER2
from ignition.hf_checkpoints import ERNIE4_5_MOE, GRANITE_MOE_SHARED, HUNYUAN_MOE, OLMOE, QWEN2_MOE
from ignition.hf_checkpoints import DEEPSEEK_V2
from ignition.hf_checkpoints import GEMMA_FAMILIES
from ignition.hf_checkpoints import QWEN3_NEXT
from ignition.hf_checkpoints import DBRX, LLAMA4, MINIMAX_M2, PHIMOE
from ignition.hf_checkpoints import AFMOE, EXAONE_MOE, FLEX_OLMO, SOLAR_OPEN
from ignition.hf_checkpoints import GRANITE_MOE_SWA, GRANITE_SWA
from ignition.hf_checkpoints import JETMOE
from ignition.hf_checkpoints import CWM, JAIS2, NANOCHAT
from ignition.hf_checkpoints import APERTUS, ARCEE, EXAONE4, GPT_NEOX, NEMOTRON, STABLELM
from ignition.hf_checkpoints import FALCON_H1, GRANITE_HYBRID, NEMOTRON_H, NEMOTRON_H_MOE
from ignition.hf_checkpoints import LFM2, LFM2_MOE
from ignition.hf_checkpoints import OLMO_HYBRID
from support.sweeps import swept

# Mixtral's experts are cut by the same code as Qwen3-MoE's (tests/parallel/test_moe_sharding.py covers
# the cut itself); GLM-4.5 adds shared experts, dense first layers and partial rotary; gpt-oss attention
# sinks (split by query head) and expert biases (the down bias added once); DeepSeek-V3 latent attention
# split by query heads (each rank keeps the whole latent history) with grouped routing and a shared
# expert; Bamba Mamba2 mixers split
# by heads and B/C groups, each rank's state rows its own share (one group: B/C whole on each rank,
# the gated norm summed over the ranks); SmolLM3 NoPE layers (each rank's heads unrotated there); Gemma 3
# sandwich norms (each block's output summed over the ranks before its norm), two rope tables, a logit soft
# cap on each rank's vocabulary rows; GLM-4 dense interleaved partial rotary under sandwich norms; OLMo 2 / 3
# blocks without pre-norms and q/k norms over whole projections (each rank's heads' share, the mean square
# summed over the ranks); Qwen2-MoE's gated shared expert (the gate whole on each rank, scaling its share);
# OLMoE's whole-projection q/k norms beside a mixture in every layer (its biased shape has one key/value head);
# Granite MoE Shared's top-k softmax routing with the residual multiplier folded into every expert's share; Hunyuan
# MoE's shared expert beside experts after q/k norms that follow the rotation; Ernie 4.5 MoE's choice bias over
# softmax routing (whole on each rank) and de-interleaved q/k rows.
# DeepSeek-V2: softmax routing over expert groups scored by their best expert (the router whole on each rank).
# Cohere: the parallel block (the attention and MLP partials summed by one all-reduce before the LayerNorm),
# each rank's heads' rows of the per-head q/k LayerNorms (Cohere2 on two ranks in the rank fuzz's sweep); StarCoder2
# LayerNorms with biases (replicated) and the non-gated MLP (its up rows and biases cut by the MLP width); Phi-2
# the parallel block with biases (added once after the one all-reduce) and the lm_head bias cut by vocabulary rows.
# Gemma / Gemma 2: Gemma 1's head_dim other than hidden / heads; Gemma 2's attention soft cap on each rank's heads.
# Qwen3-Next: Gated DeltaNet layers split by key heads (each with its value heads: their q/k/v/z/b/a
# rows, convolution channels and state rows), the attention output gate's rows by query heads, gated shared experts.
FAMILIES = (DENSE_FAMILIES + (QWEN3_MOE, GLM4_MOE, DEEPSEEK, GPT_OSS, BAMBA, BAMBA_ONE_GROUP) + PHI3_FAMILIES
            + (SMOLLM3,) + GEMMA3_FAMILIES + (GLM4,) + OLMO_FAMILIES + (COHERE, STARCODER2, PHI2)
            + (QWEN2_MOE, OLMOE, GRANITE_MOE_SHARED, HUNYUAN_MOE, ERNIE4_5_MOE) + (DEEPSEEK_V2,)
            + GEMMA_FAMILIES + (QWEN3_NEXT,))
# Families whose cuts others in the list make too run on two ranks only with HELIOS_FAMILY_RANK_SWEEP=1 (for
# the suite's time): Llama 2 and Mistral (Llama 3's cut under another rope, or with windows as gpt-oss's), Qwen2 (q/k/v
# biases by head rows, as Gemma 1's and Phi-2's), Qwen3 (per-head q/k norms, as Gemma 3's), Phi-3-mini (its
# checkpoint's fused q/k/v and gate/up rows are the fused rows Llama's recipe prepares: Llama 3's cut, which
# test_two_ranks_with_weights_in_parts_generate_what_one_rank_generates serves, with windows on each rank's heads as
# gpt-oss's), Phi-4-mini (Phi-3's fused rows under partial rotary, as Phi-2's), GLM-4 (partial rotary on each rank's
# heads as Phi-2's, under sandwich norms as Gemma 2's and 3's), SmolLM3 (NoPE layers: Llama 3's cut, each rank's
# heads left unrotated), Granite MoE Shared
# (Qwen3-MoE's experts by width, a shared expert by width as DeepSeek-V3's, its multipliers folded into the weights
# before the cut), the capped Gemma 3 (the final soft cap on each rank's vocabulary rows, as
# Gemma 2's), OLMo 2 and OLMo 3 (whole-projection q/k norms, as OLMoE's, in blocks normed after their summed outputs,
# as Gemma 2's and 3's), Gemma 1 (a head_dim other than hidden / heads, as Gemma 2's), Hunyuan MoE (norms after the
# rotation beside a shared expert, each as another family's), DeepSeek-V2 (DeepSeek-V3's latent cut), GLM-4.5
# (DeepSeek-V3's grouped experts, shared expert and dense first layers beside partial rotary as Phi-2's), StarCoder2
# (Phi-2's biased LayerNorms and non-gated MLP with biases), Qwen2-MoE (Qwen3-Next's gated shared expert) and Bamba
# (test_hybrid_ranks_hold_their_share_of_the_state_and_restore_snapshots serves it on two ranks against one; its
# single-group sibling runs here), Gemma 3 (test_config_fuzz_ranks' gemma3 seed cuts its heads, sandwich norms, two
# rope tables and per-head q/k norms on four ranks against transformers; Gemma 2, sandwich
# norms too, runs here), DeepSeek-V3 (test_config_fuzz_ranks' deepseek seed cuts its latent heads through the
# low-rank query pair, a dense layer, grouped routing over experts cut by width, a shared expert and YaRN on two ranks
# against transformers, with MIXED programs). Two run here only in the sweep because other default tests serve the
# very same two-rank cores against the same references: Llama 3
# (test_two_ranks_with_weights_in_parts_generate_what_one_rank_generates checks its two-rank core's greedy tokens
# of PROMPTS against transformers', as the test below would) and Qwen3-MoE
# (test_stress_ranks' qwen3_moe case serves the stress mix on its two-rank core against its one-rank core, and
# test_generate_cli's loopback rank gives its greedy tokens of PROMPTS against transformers').
_FAMILY_SWEEP = {"llama2", "mistral", "qwen2", "qwen3", "phi3-mini", "phi4-mini", "glm4", "smollm3",
                 "granite_moe_shared", "gemma3-capped", "olmo2", "olmo3", "gemma", "hunyuan_moe", "deepseek_v2",
                 "glm4_moe", "starcoder2", "qwen2_moe", "bamba", "gemma3", "deepseek", "llama3", "qwen3_moe"}
if not swept("HELIOS_FAMILY_RANK_SWEEP"):
    FAMILIES = tuple(family for family in FAMILIES if family.name not in _FAMILY_SWEEP)
# Llama 4 (chunked and NoPE layers' heads, experts weighted on their whole inputs, the shared expert cut by width),
# MiniMax-M2 (OLMoE's whole-projection q/k norms under partial rotary), DBRX (q/k/v clamped on each rank's rows) and
# PhiMoE (SparseMixer routing, whole on each rank), K-EXAONE (dots.llm1's experts beside EXAONE 4's attention),
# Solar Open (GLM-4.5's experts in every layer), AFMoE (the output gate's rows by query head, as Qwen3-Next's),
# FlexOlmo (OLMo 2's whole-projection q/k norms beside OLMoE's experts), Granite SWA and Granite MoE SWA (sinks by
# query head, as gpt-oss's; Granite SWA is dense but sweeps here with its MoE sibling), JetMoE (whole key/value
# groups of expert heads on each rank, the attention router whole):
# shapes the families above already cut, so only with HELIOS_MOE_RANK_SWEEP=1 (about 25 s each).
if swept("HELIOS_MOE_RANK_SWEEP"):
    FAMILIES += (LLAMA4, MINIMAX_M2, DBRX, PHIMOE, EXAONE_MOE, SOLAR_OPEN, AFMOE, FLEX_OLMO,
                 GRANITE_SWA, GRANITE_MOE_SWA, JETMOE)
# EXAONE 4, Apertus, Arcee, Nemotron, StableLM and GPT-NeoX cut into shapes the families above cover (per-head q/k
# norms, the non-gated MLP's rows, replicated LayerNorms and xIELU scalars, the parallel block with biases; GPT-NeoX's
# MLP norm is whole on each rank like its input), CWM and Jais 2 (Ministral's windows, StarCoder2's LayerNorms and
# Nemotron's MLP), nanochat (its embedding norm whole on each rank like the embeddings): two ranks only with HELIOS_DENSE_RANK_SWEEP=1.
if swept("HELIOS_DENSE_RANK_SWEEP"):
    FAMILIES += (EXAONE4, APERTUS, ARCEE, NEMOTRON, STABLELM, GPT_NEOX, CWM, JAIS2, NANOCHAT)
# The Mamba2 hybrids after Bamba (split as Bamba's mixers are): Granite 4.0's experts, Nemotron-H's layers
# without an MLP and non-gated relu2 experts, Falcon-H1's attention and mixer in one layer; LFM2's short
# convolutions split by channels (their B/C/x rows, taps and windows; out's columns, its bias added once), beside
# LFM2-MoE's experts; OLMo Hybrid's Gated DeltaNet layers split as Qwen3-Next's, its whole-projection q/k norms'
# squares summed over the ranks.
if swept("HELIOS_HYBRID_RANK_SWEEP"):
    FAMILIES += (GRANITE_HYBRID, NEMOTRON_H, NEMOTRON_H_MOE, FALCON_H1, LFM2, LFM2_MOE, OLMO_HYBRID)

# DeepSeek-V3.2 and GLM-5: latent heads split as DeepSeek-V3's, the token indexer whole on each rank (every rank
# selects alike and keeps the whole index plane): only with HELIOS_DSA_RANK_SWEEP=1 (about 25 s each).
if swept("HELIOS_DSA_RANK_SWEEP"):
    from ignition.test_deepseek_v32_recipe import DEEPSEEK_V32, GLM5

    FAMILIES += (DEEPSEEK_V32, GLM5)

from .conftest import MAX_TOKENS, RESTORING, greedy_tokens, running


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_two_ranks_generate_what_one_rank_generates(cores, family):
    two = greedy_tokens(cores.open(cores.core(family, 2)))
    assert two == cores.reference_tokens(family)
    assert all(len(tokens) == 10 for tokens in two)


def test_two_ranks_with_weights_in_parts_generate_what_one_rank_generates(cores):
    """Each rank's weights cut into several resources (conftest prepares Llama 3's two-rank core
    so): rank 1 finds its parts by position."""
    core = cores.open(cores.core(LLAMA3, 2))  # its checkpoint and reference tokens serve the family test too
    parts = [info for info in core.resources if info.kind.name == "WEIGHTS"]
    assert len([p for p in parts if p.rank == 1]) == len([p for p in parts if p.rank == 0]) > 2
    assert greedy_tokens(core) == cores.reference_tokens(LLAMA3)


def _restoring_run(core) -> tuple[list[list[int]], object, list]:
    """RESTORING's prompts one after another: tokens, counters, rank 0's state plane shapes."""
    with running(core) as runtime:
        tokens = [list(generate(runtime.engine, [prompt], MAX_TOKENS)[0].token_ids) for prompt in RESTORING]
        state = [tuple(runtime.model.buffers[name].shape) for name in ("conv_state", "ssm_state")]  # rank 0's
        return tokens, runtime.engine.scheduler.counters(), state


def test_hybrid_ranks_hold_their_share_of_the_state_and_restore_snapshots(cores):
    """Two ranks restore a snapshot of their halves of Bamba's state rows (its two B/C groups split) and
    continue with the one-rank tokens (transformers' greedy ones, as test_families compares every family)."""
    tokens, counters, state = _restoring_run(cores.open(cores.core(BAMBA, 2)))
    assert tokens == cores.reference_tokens(BAMBA, RESTORING)
    assert counters.snapshots_restored == 1
    whole = load_checkpoint(cores.checkpoint(BAMBA)).architecture.recurrent  # one rank's geometry
    layers, rows = len(whole.layers), state[0][1]
    assert rows > 0 and state == [(layers, rows, whole.conv_dim // 2, whole.conv_kernel - 1),
                                  (layers, rows, whole.num_heads // 2, whole.head_dim, whole.state_size)]

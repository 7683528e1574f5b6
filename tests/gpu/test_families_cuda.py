"""The families added after the first CUDA family test, end to end on CUDA through the real runtime:
float32 cores in CUDA graphs give the CPU path's greedy tokens for prompts of different lengths
(chunked prefill included), with logits equal up to rounding (tests/gpu/test_runtime_cuda.py's
check, in a file of its own so that the suite's workers share the preparations).

Each family reaches an op or switch the older ones do not: Phi-3's partial rotary, window and
LongRoPE list; SmolLM3's NoPE layers; Seed-OSS's biases; Ernie 4.5's de-interleaved heads; Granite's
multipliers; Hunyuan's q/k norms after rotary; Gemma 3's sandwich norms, gated GELU-tanh
(``helios::gelu_tanh_mul``), scaled embeddings, local rope table and (capped) final logit soft cap;
Cohere's LayerNorms (``helios::layer_norm``, a torch composite on CUDA), parallel block and per-head q/k
LayerNorms, Cohere2's unrotated full layers; StarCoder2's biased LayerNorms and non-gated GELU-tanh
MLP; Phi-2's lm_head bias under the parallel block and partial rotary;
GLM-4 dense's interleaved partial rotary under sandwich norms; OLMo 2 / 3's blocks without pre-norms and
q/k norms over whole projections; Qwen2-MoE's gated shared expert beside sparse and dense layers;
OLMoE's whole-projection q/k norms beside a mixture in every layer; Granite MoE's top-k softmax routing
(and the shared variant's shared expert); Hunyuan MoE's
shared expert beside experts after q/k norms that follow the rotation; Ernie 4.5 MoE's
softmax routing with a choice bias (the Triton routing kernel's biased softmax).
DeepSeek-V2's softmax routing with groups scored by their best expert (the Triton route kernel), V2-Lite's
direct query projection, GLM-4.7-Flash's sparse layers by layer kind; dots.llm1's q/k norms and biases
beside grouped sigmoid routing, its last layer sliding; Youtu-LLM's dense latent layers, tied.
Qwen3-Next's and Qwen3.5's Gated DeltaNet layers (``helios::gated_delta_rule``, its torch body on CUDA, and
the short convolution in state rows) beside gated attention with partial rotary.
EXAONE 4's per-head q/k norms in layers without pre-norms, its global layers unrotated; Apertus's
non-gated xIELU MLP (learned scalars per layer); Arcee's non-gated relu^2 MLP with biases, tied; Nemotron's LayerNorm1P (weight + 1) under partial rotary; StableLM's
parallel residual with per-head q/k LayerNorms under partial rotary; GPT-NeoX's parallel residual whose MLP
reads its own norm (``parallel_mlp_norm``), the exact-GELU MLP; GLM v1's interleaved partial rotary without
sandwich norms; Helium's interleaved whole-head rotary; Ministral's sliding and full layers; VaultGemma's
soft caps without sandwich norms; OLMo v1's parameter-free LayerNorms and clamped q/k/v;
Ministral 3's per-position query scaling on every layer.
Granite 4.0's Mamba2 mixers (``helios::causal_conv_update`` / ``helios::ssm_scan``) beside its experts,
multipliers and attention with or without positions; Nemotron-H's layers without an MLP and the non-gated
relu^2 MLP beside Mamba2 mixers (heads whose width is not a multiple of hidden_size), its non-gated relu^2
experts (the Triton expert kernels' relu2 path) beside grouped sigmoid routing; Falcon-H1's attention and
Mamba2 mixer side by side in every layer (gated without a norm, or with the gated norm). LFM2's gated short
convolutions (``helios::causal_conv_update`` alone, its window the whole state) beside attention with q/k norms
(LFM2-MoE: beside sigmoid-routed experts with a choice bias). OLMo Hybrid's Gated DeltaNet layers (beta doubled)
beside OLMo 2's attention blocks (output norms, whole-projection q/k norms), rotary or unrotated. Kimi Linear's Kimi
Delta Attention (``helios::gated_delta_rule`` with a decay per key channel, its torch body on CUDA) beside latent
attention in a hybrid; the Bailing hybrid's full-rank and safe gates beside gated rotary latent attention.
Llama 4's chunked local attention (``helios::paged_attention_chunked``, its Triton kernel), NoPE layers'
temperature tuning and experts weighted on their inputs beside a shared expert; MiniMax-M2's whole-projection
q/k norms under partial rotary beside sigmoid routing with a choice bias; DBRX's clamped q/k/v under LayerNorms
beside softmax experts; PhiMoE's SparseMixer routing (``helios::moe_route_sparsemixer``, its torch body on CUDA).
K-EXAONE's per-head q/k norms and unrotated global layers beside grouped sigmoid routing and a shared expert;
Solar Open's q/k/v biases beside grouped sigmoid routing in every layer and a shared expert two experts wide;
AFMoE's attention output gate (``Architecture.attention_gate`` in the plain decoder), NoPE full layers, four norms a
layer and scaled embeddings beside sigmoid experts with a choice bias; FlexOlmo's OLMo 2 block beside softmax experts;
Granite SWA's sinks (``helios::paged_attention_sinks``) with sliding layers, an unrotated layer and two rope tables,
and Granite MoE SWA's sinks beside top-k softmax experts and a shared expert. CWM's sliding layers under a llama3
rope; Jais 2's biased LayerNorms and relu^2 MLP; nanochat's normed embeddings (``Architecture.embedding_norm``),
reversed rotation (negated frequencies) and q/k norms after it under a final logit cap; JetMoE's mixture of
attention heads (``Architecture.attention_experts``: heads scaled by routing weights) beside biased experts.
DeepSeek-V3.2's and GLM-5's token indexer (``helios::index_key_write`` / ``index_topk`` /
``paged_latent_attention_selected``: torch bodies on CUDA, captured in graphs), GLM-5's shared layer.
"""

from __future__ import annotations

import pytest

from gpu import test_runtime_cuda as base
from ignition.hf_checkpoints import ERNIE4_5, GEMMA3, GEMMA3_CAPPED, GRANITE, HUNYUAN, PHI3_MINI, SEED_OSS, SMOLLM3
from ignition.hf_checkpoints import COHERE, COHERE2, GLM4, OLMO2, OLMO3, PHI2, STARCODER2
from ignition.hf_checkpoints import ERNIE4_5_MOE, GRANITE_MOE, GRANITE_MOE_SHARED, HUNYUAN_MOE, OLMOE, QWEN2_MOE
from ignition.hf_checkpoints import GEMMA_FAMILIES
from ignition.hf_checkpoints import DOTS1, LATENT_FAMILIES, YOUTU
from ignition.hf_checkpoints import QWEN3_5, QWEN3_5_MOE, QWEN3_NEXT
from ignition.hf_checkpoints import APERTUS, ARCEE, EXAONE4, GLM, GPT_NEOX, HELIUM, MINISTRAL, NEMOTRON, STABLELM
from ignition.hf_checkpoints import MINISTRAL3, OLMO1, VAULTGEMMA
from ignition.hf_checkpoints import FALCON_H1_FAMILIES, GRANITE_HYBRID_FAMILIES, NEMOTRON_H, NEMOTRON_H_MOE
from ignition.hf_checkpoints import DBRX, LLAMA4, MINIMAX_M2, PHIMOE
from ignition.hf_checkpoints import AFMOE, EXAONE_MOE, FLEX_OLMO, SOLAR_OPEN
from ignition.hf_checkpoints import GRANITE_MOE_SWA, GRANITE_SWA
from ignition.hf_checkpoints import CWM, JAIS2, NANOCHAT
from ignition.hf_checkpoints import JETMOE
from ignition.hf_checkpoints import LFM2, LFM2_MOE
from ignition.hf_checkpoints import OLMO_HYBRID, OLMO_HYBRID_NOPE
from ignition.hf_checkpoints import BAILING_HYBRID, KIMI_LINEAR
from ignition.test_deepseek_v32_recipe import DEEPSEEK_V32, GLM5
from support.runtime_runs import first_difference, greedy_run, logits_error

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cores(tmp_path_factory) -> base.Cores:
    return base.Cores(tmp_path_factory.mktemp("gpu-family-cores"))


@pytest.mark.parametrize("family", [PHI3_MINI, SMOLLM3, SEED_OSS, ERNIE4_5, GRANITE, HUNYUAN, GEMMA3,
                                    GEMMA3_CAPPED, GLM4, OLMO2, OLMO3, COHERE,
                                    COHERE2, STARCODER2, PHI2, QWEN2_MOE, OLMOE, GRANITE_MOE, GRANITE_MOE_SHARED, HUNYUAN_MOE,
                                    ERNIE4_5_MOE, *GEMMA_FAMILIES,
                                    *LATENT_FAMILIES, DOTS1, YOUTU, QWEN3_NEXT, QWEN3_5, QWEN3_5_MOE,
                                    EXAONE4, APERTUS, ARCEE, NEMOTRON, STABLELM, GPT_NEOX, GLM, HELIUM, MINISTRAL, VAULTGEMMA, OLMO1, MINISTRAL3, *GRANITE_HYBRID_FAMILIES,
                                    NEMOTRON_H, NEMOTRON_H_MOE, *FALCON_H1_FAMILIES, LLAMA4, MINIMAX_M2, DBRX, PHIMOE,
                                    DEEPSEEK_V32, GLM5, EXAONE_MOE, SOLAR_OPEN, LFM2, LFM2_MOE, AFMOE, FLEX_OLMO,
                                    GRANITE_SWA, GRANITE_MOE_SWA, OLMO_HYBRID, OLMO_HYBRID_NOPE, KIMI_LINEAR, BAILING_HYBRID, CWM, JAIS2,
                                    NANOCHAT, JETMOE],
                         ids=lambda f: f.name)
def test_float32_greedy_tokens_on_cuda_equal_the_cpu_path(cores, family):
    reference = cores.cpu_run(family)
    run = greedy_run(cores.open(family), base.PROMPTS, base.NEW_TOKENS, base.cuda_options())
    assert run.captured
    for index, (tokens, expected) in enumerate(zip(run.tokens, reference.tokens)):
        assert tokens == expected, f"prompt {index} (length {len(base.PROMPTS[index])}) differs from token " \
                                   f"{first_difference(tokens, expected)}"
    assert logits_error(run, reference) < 1e-3

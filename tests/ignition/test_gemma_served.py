"""Gemma 2 (and, with HELIOS_FAMILY_SERVED_SWEEP=1, Gemma) checkpoints prepared into signed cores and served
through the runtime on the C++ kernels, against transformers in float32.

The shapes: Gemma 1 with head_dim 32 of hidden 64 / 4 heads, tied; Gemma 2 with sliding, full,
sliding, full layers over a window of 6, ``query_pre_attn_scalar`` other than head_dim, an attention
logit soft cap of 3 (``helios::paged_attention_softcap``: the CPU fast paths leave it to its registered
body) and a final logit soft cap. Batched prompts shorter and longer than the window (one past the
prefill capacity: chunked) and a continuation served from the prefix cache give the reference's greedy
tokens and logits.
"""

from __future__ import annotations

import pytest
import transformers

from support.sweeps import in_sweep

from .hf_checkpoints import Family
from .test_llama_shaped_served import check_served_core

GEMMA_SHAPED = Family("gemma-served", transformers.GemmaConfig, (
    ("head_dim", 32), ("tie_word_embeddings", True), ("rope_parameters", {"rope_type": "default", "rope_theta": 500.0}),
))
GEMMA2_SHAPED = Family("gemma2-served", transformers.Gemma2Config, (
    ("num_hidden_layers", 4), ("head_dim", 16), ("sliding_window", 6), ("query_pre_attn_scalar", 20),
    ("attn_logit_softcapping", 3.0), ("final_logit_softcapping", 20.0), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
))
PROMPT_LENS = (4, 20, 37)  # within the window; past it; past the 32-token prefill capacity (chunked)


# Gemma 1 with HELIOS_FAMILY_SERVED_SWEEP=1: by default Gemma 2's and test_gemma3_served's cores serve its
# switches (the (1 + w) norms, the scaled lookup, the GELU-tanh gated MLP, tied embeddings), and the Qwen3 cores
# of the server tests a head_dim (32) past hidden_size / heads.
@pytest.mark.parametrize("family", in_sweep("HELIOS_FAMILY_SERVED_SWEEP", (GEMMA2_SHAPED,), (GEMMA_SHAPED,)),
                         ids=lambda family: family.name)
def test_a_served_gemma_core_gives_the_reference_tokens(tmp_path, family):
    check_served_core(tmp_path, family, PROMPT_LENS)

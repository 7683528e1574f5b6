"""A Gemma 3 text checkpoint prepared into a signed core and served through the runtime on the C++
kernels, against transformers in float32.

The shape: sliding, full, sliding, full layers (``sliding_window_pattern`` 2) over a window of 6,
a linear-scaled global rope beside the local one, ``query_pre_attn_scalar`` other than head_dim, a
final logit soft cap, tied embeddings. Batched prompts shorter and longer than the window (one past
the prefill capacity: chunked) and a continuation served from the prefix cache give the reference's
greedy tokens and logits; the supported-architecture list holds Gemma3ForCausalLM.
"""

from __future__ import annotations

import transformers

from helios.ignition.recipes import SUPPORTED_ARCHITECTURES

from .hf_checkpoints import Family
from .test_llama_shaped_served import check_served_core

GEMMA3_SHAPED = Family("gemma3-served", transformers.Gemma3TextConfig, (
    ("num_hidden_layers", 4), ("head_dim", 16), ("sliding_window", 6), ("sliding_window_pattern", 2),
    ("query_pre_attn_scalar", 20), ("final_logit_softcapping", 50.0), ("tie_word_embeddings", True),
    ("rope_parameters", {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
))
PROMPT_LENS = (4, 20, 37)  # within the window; past it; past the 32-token prefill capacity (chunked)


def test_a_served_gemma3_core_gives_the_reference_tokens(tmp_path):
    assert "Gemma3ForCausalLM" in SUPPORTED_ARCHITECTURES
    check_served_core(tmp_path, GEMMA3_SHAPED, PROMPT_LENS)

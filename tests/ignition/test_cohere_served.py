"""A Cohere checkpoint prepared into a signed core and served through the runtime on the C++
kernels, against transformers in float32 (tests/ignition/test_llama_shaped_served.py's run: two batched
prompts, one past the 32-token prefill capacity and chunked, and a continuation of the longer one served
from the prefix cache give the reference's greedy tokens and logits).

helios::layer_norm, the parallel block, per-head q/k LayerNorms, interleaved rotary and the folded logit
scale on tied embeddings. (Cohere2 adds sliding layers and unrotated full layers, which other families'
served cores reach: Mistral's windows, SmolLM3's NoPE layers.)
"""

from __future__ import annotations

from .hf_checkpoints import COHERE
from .test_llama_shaped_served import check_served_core


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, COHERE)

"""With HELIOS_FAMILY_SERVED_SWEEP=1: a Phi-2 checkpoint prepared into a signed core and served through the
runtime on the C++ kernels, against transformers in float32 (tests/ignition/test_llama_shaped_served.py's run:
two batched prompts, one past the 32-token prefill capacity and chunked, and a continuation of the longer one
served from the prefix cache give the reference's greedy tokens and logits): helios::layer_norm with biases,
the parallel block, the non-gated GELU-tanh MLP, partial rotary and the lm_head bias.
"""

from __future__ import annotations

from support.sweeps import swept

from .hf_checkpoints import PHI2
from .test_llama_shaped_served import check_served_core

# HELIOS_FAMILY_SERVED_SWEEP: by default other families' served cores take each of Phi-2's switches: LayerNorms
# with biases and the non-gated GELU-tanh MLP (test_starcoder2_served), the parallel block (test_cohere_served),
# partial rotary (test_minimax_m2_recipe) and the lm_head bias (test_phimoe_recipe).
if swept("HELIOS_FAMILY_SERVED_SWEEP"):
    def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
        check_served_core(tmp_path, PHI2)

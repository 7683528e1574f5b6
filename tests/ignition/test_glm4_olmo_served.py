"""With HELIOS_FAMILY_SERVED_SWEEP=1: GLM-4 dense and OLMo 3 checkpoints prepared into signed cores and served
through the runtime on the C++ kernels, against transformers in float32 (tests/ignition/test_llama_shaped_served.py's
run: two batched prompts, one past the 32-token prefill capacity and chunked, and a continuation of the longer
one served from the prefix cache give the reference's greedy tokens and logits).

GLM-4: sandwich norms and interleaved partial rotary with q/k/v biases. OLMo 3: blocks without
pre-norms, q/k norms over the whole projections, sliding and full layers (a window of 5, shorter
than the prompts) with two rope tables. (OLMo 2 is OLMo 3 without sliding layers, with biases: its
programs add no op, and tests/parallel/test_families serves it on two ranks.)
"""

from __future__ import annotations

import pytest

from support.sweeps import swept

from .hf_checkpoints import GLM4, OLMO3
from .test_llama_shaped_served import check_served_core

# HELIOS_FAMILY_SERVED_SWEEP: both cores' programs call no op with arguments other than those of
# test_qwen2_moe_recipe's served core (the same norms, attention scale, windowed and full attention), and by
# default other families' served cores take each of their switches: sandwich norms (test_gemma_served's Gemma 2,
# test_gemma3_served), interleaved rotary (test_cohere_served), partial rotary and q/k norms over the whole
# projections (test_minimax_m2_recipe), q/k/v biases (test_qwen2_moe_recipe), sliding and full layers with two
# rope tables (test_gemma3_served); the norms without pre-norms are the graph's own ops, which each family's
# captured checks (test_glm4_recipe, test_olmo_recipe) run against transformers.
if swept("HELIOS_FAMILY_SERVED_SWEEP"):
    @pytest.mark.parametrize("family", (GLM4, OLMO3), ids=lambda family: family.name)
    def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path, family):
        check_served_core(tmp_path, family)

"""A DeepSeek-V2 checkpoint prepared into a signed core and served through the runtime on the C++
kernels, against transformers in float32 (tests/ignition/test_llama_shaped_served.py's run: two
batched prompts, one past the 32-token prefill capacity and chunked, and a continuation of the longer
one served from the prefix cache give the reference's greedy tokens and logits).

DeepSeek-V2's routing (softmax over every expert, groups scored by their best expert, the weights
scaled and never renormalised) through the paged latent history. (V2-Lite's direct query projection
and GLM-4.7-Flash's layers add no op of their own: DeepSeek-V3's served cores, with and without a
query rank, are tests/speculative/test_deepseek_core.py's and test_config_fuzz_served's.)
"""

from __future__ import annotations

from .hf_checkpoints import DEEPSEEK_V2
from .test_llama_shaped_served import check_served_core


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, DEEPSEEK_V2, mixed=True)

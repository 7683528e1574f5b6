"""Cohere and Cohere2 checkpoints prepared into signed cores and served through the runtime on the C++
kernels, against transformers in float32 (tests/ignition/test_llama_shaped_served.py's run: two batched
prompts, one past the 32-token prefill capacity and chunked, and a continuation of the longer one served
from the prefix cache give the reference's greedy tokens and logits).

Cohere: helios::layer_norm, the parallel block, per-head q/k LayerNorms, interleaved rotary and the folded
logit scale on tied embeddings. Cohere2: sliding layers (a window of 5, shorter than the prompts) beside a
full layer that rotates nothing.
"""

from __future__ import annotations

import pytest

from .hf_checkpoints import COHERE_FAMILIES
from .test_llama_shaped_served import check_served_core


@pytest.mark.parametrize("family", COHERE_FAMILIES, ids=lambda family: family.name)
def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path, family):
    check_served_core(tmp_path, family)

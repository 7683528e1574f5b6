"""The Triton compiler, stricter than the interpreter that runs the kernels' tests here, accepts every
kernel for a Hopper GPU (PTX and ptxas, sm_90) without a GPU: the attention (prefill, decode, combine,
cache write; with sinks and a soft cap), fused decoder, sampling and draw, matrix-vector and skinny
product, expert and routing, latent-attention and chunked-attention kernels, as each
`compile_*_kernels.py` script compiles them (every tile and variant with HELIOS_COMPILE_SWEEP=1).

One process compiles all of them: each script's own process paid the imports of torch, helios and
Triton's backend again (about 3 s of CPU each)."""

from __future__ import annotations

import pytest

from support.hopper_compile import HANG_GUARD_S, compile_for_hopper

SCRIPTS = ("compile_attention_kernels.py", "compile_fused_kernels.py", "compile_moe_kernels.py",
           "compile_latent_kernels.py", "compile_chunked_kernels.py")


# A hang guard in place of the suite's 300 s per test: on a loaded 2-core machine the attention kernels alone
# have taken over 240 s.
@pytest.mark.timeout(HANG_GUARD_S)
def test_kernels_compile_for_hopper():
    compile_for_hopper(*SCRIPTS)

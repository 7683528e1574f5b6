"""The hybrid core's batched greedy tokens on CUDA equal transformers' on every CUDA path: one or
two execution frames, CUDA graphs or eager programs (four runs of tests/gpu/test_hybrid_cuda.py's
batched case; a failing cell names the path). The CPU emulations of each path are
tests/runtime/test_hybrid_two_frames.py; state buffer by buffer, tests/gpu/test_hybrid_state_cuda.py.

The reference is transformers with Mamba2's grouped gated norm on every release
(support.bamba_reference): transformers 5.17 normalises Bamba's gated scan output over the whole
width, which with two groups changes every token after a coincidentally equal first one (what
these cells once reported as a CUDA fault: CUDA's tokens were the CPU's all along)."""

from __future__ import annotations

import pytest

from helios.contract import StartupOptions
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, expected, hybrid  # noqa: F401

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("frames", [1, 2])
@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_batched_tokens_by_path(hybrid, expected, frames, cuda_graphs):  # noqa: F811
    root, _ = hybrid
    core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(), device="cuda", cuda_graphs=cuda_graphs)
    runtime = build_runtime(core, RuntimeOptions(load=load))
    runtime.engine.frames = frames
    try:
        results = generate(runtime.engine, PROMPTS, STEPS)
        assert [list(r.token_ids) for r in results] == expected
    finally:
        runtime.close()

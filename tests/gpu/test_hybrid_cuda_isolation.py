"""Which CUDA-only path breaks the hybrid core's tokens: one or two execution frames, CUDA graphs
or eager programs (four runs of tests/gpu/test_hybrid_cuda.py's batched case). Diagnostic: a
failing cell names the path; the CPU emulations of each path pass
(tests/runtime/test_hybrid_two_frames.py)."""

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

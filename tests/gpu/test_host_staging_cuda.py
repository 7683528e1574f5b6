"""Engram host staging on CUDA: the table stays in host memory, each step's rows are gathered into a
pinned host frame and copied asynchronously before the program (eager and as CUDA graphs); the
tokens equal the plain reference computation's (tests/runtime/test_host_staging.py on the CPU)."""

from __future__ import annotations

import pytest

from helios.contract import StartupOptions
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_host_staging import PROMPTS, engram  # noqa: F401 (the module-scoped core fixture)
from runtime.test_model_fixture import open_fixture
from support.engram_core import reference_tokens

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_an_engram_core_serves_the_reference_tokens_on_cuda(engram, cuda_graphs):  # noqa: F811
    model, path = engram
    load = LoadOptions(startup=StartupOptions(), device="cuda", cuda_graphs=cuda_graphs)
    runtime = build_runtime(open_fixture(path), RuntimeOptions(load=load))
    try:
        assert runtime.model.weights["engram.table"].device.type == "cpu"
        assert runtime.model.weights["engram.embed"].device.type == "cuda"
        staging = runtime.engine.executor.packer.host_staging
        assert all(frame.is_pinned() for frames in staging._frames.values() for frame in frames)
        results = generate(runtime.engine, PROMPTS, 12)
        assert [list(r.token_ids) for r in results] == [reference_tokens(model, p, 12) for p in PROMPTS]
    finally:
        runtime.close()

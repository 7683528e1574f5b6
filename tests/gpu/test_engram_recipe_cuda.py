"""An Engram checkpoint prepared by `helios prepare` (tests/ignition/test_engram_recipe.py on the CPU)
served on CUDA, eager and as CUDA graphs: the table stays in host memory, every step's rows are staged
through pinned host frames, and the greedy tokens equal the `transformers` reference on inputs_embeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.core.reader import open_core
from helios.ignition.engram import read_engram
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.test_engram_recipe import (  # noqa: F401 (checkpoint, key: the module-scoped fixtures)
    MAX_TOKENS, NAMESPACE, PROMPTS, _prepare, _reference, checkpoint, key,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_an_engram_core_serves_the_reference_tokens_on_cuda(checkpoint, key, cuda_graphs):  # noqa: F811
    directory, model = checkpoint
    engram = read_engram(directory, model.config.hidden_size, "float32")
    core = open_core(_prepare(directory, key, 1), accept=NAMESPACE, trusted_keys=[Path(str(key) + ".pub")])
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=cuda_graphs)))
    try:
        assert runtime.model.weights["w.engram.table"].device.type == "cpu"
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
        assert [list(r.token_ids) for r in results] == [_reference(model, engram, p) for p in PROMPTS]
    finally:
        runtime.close()

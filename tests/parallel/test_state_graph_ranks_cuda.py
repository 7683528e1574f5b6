"""Two GPU ranks (rank 1 a local process) of a hybrid core with SNAPSHOT, RESTORATION and RESUME graphs,
programs replayed as CUDA graphs on every rank (the state-copy programs too): a shared prefix restored
through the core's programs gives the tokens one GPU gives (tests/parallel/test_state_graph_ranks.py
on the CPU)."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.loading.cuda_graphs import CapturedProgram
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import BAMBA
from support.state_graphs_core import write_state_graphs_core

from .conftest import FAST, MAX_TOKENS, NAMESPACE, PROMPTS
from .test_cuda import GPU_RANKS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism on CUDA needs two GPUs"),
]


def _restoring_run(cores, ranks: int, tmp_path):
    path = write_state_graphs_core(cores.open(cores.core(BAMBA, ranks)), cores.key, NAMESPACE,
                                   tmp_path / f"state-cuda-tp{ranks}.core")
    options = RuntimeOptions(load=LoadOptions(device="cuda"), ranks=GPU_RANKS if ranks > 1 else FAST)
    runtime = build_runtime(cores.open(path), options)
    try:
        model = runtime.engine.executor.model
        assert all(isinstance(p.module, CapturedProgram) for p in (*model.programs, *model.state_copy_programs))
        prompts = [PROMPTS[0], PROMPTS[0] + [7, 8, 9]]
        tokens = [list(generate(runtime.engine, [prompt], MAX_TOKENS)[0].token_ids) for prompt in prompts]
        return tokens, dict(runtime.engine.stats.snapshot().graph_launches)
    finally:
        runtime.close()


def test_two_gpu_ranks_restore_through_the_cores_programs_as_one_gpu_does(cores, tmp_path):
    one_tokens, one_launches = _restoring_run(cores, 1, tmp_path)
    two_tokens, two_launches = _restoring_run(cores, 2, tmp_path)
    assert two_tokens == one_tokens
    for launches in (one_launches, two_launches):
        assert launches["snapshot"] >= 1 and launches["restoration"] == 1 and launches["resume"] >= 1
